//! The `sluice` command: translates envoyproxy/ratelimit's variables into the options'
//! defaults, parses the flags (`cli`, each also read from a `SLUICE_*` variable) into
//! [`sluice::Settings`], and hands them over: logging, [`sluice::Server::build`], the
//! listeners, SIGTERM, [`sluice::Server::run`]. What the commands do lives in the library
//! ([`sluice::server`], [`sluice::app`]), where tests run it in process.
#![forbid(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Long functions (threshold and why: clippy.toml). Tests tell one scenario top to bottom and
// are left out.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

mod cli;

use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches};
use cli::{Cli, Command, LogFormat, ServeArgs, load_options, redis_settings_given};
use sluice::app;
use sluice::compat::Translation;
use sluice::config::HeaderFormat;
use sluice::{Listeners, Server};

/// Per-request allocations (h2 frames, prost messages, Redis commands) are many and short-lived;
/// mimalloc serves them from thread-local pages where glibc malloc spent ~16% of the CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The name envoyproxy/ratelimit's image runs its binary under (`/bin/ratelimit`, which Envoy
/// Gateway's Deployment runs with no arguments).
const RATELIMIT_NAME: &str = "ratelimit";

/// Started as `ratelimit` with no arguments: serve from the environment, as envoyproxy/ratelimit
/// does, with its defaults for what the environment leaves unset.
fn started_as_ratelimit() -> bool {
    let mut args = std::env::args_os();
    let name = args.next();
    let named = name
        .as_deref()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == RATELIMIT_NAME);
    named && args.next().is_none()
}

fn main() -> ExitCode {
    // envoyproxy/ratelimit's variables, translated, become the defaults of the options whose
    // SLUICE_* variable they stand for: a flag or that variable still wins.
    let as_ratelimit = started_as_ratelimit();
    let env = |name: &str| std::env::var(name).ok();
    let compat = if as_ratelimit {
        sluice::compat::translate(&sluice::compat::with_ratelimit_defaults(&env))
    } else {
        sluice::compat::translate(&env)
    };
    let command = cli::with_translated_defaults(Cli::command(), &compat.set);
    let matches = if as_ratelimit {
        command.get_matches_from([RATELIMIT_NAME, "serve"])
    } else {
        command.get_matches()
    };
    // The variables without a flag (the Redis secrets): the environment's, else translated.
    let variable = |name: &str| {
        std::env::var(name)
            .ok()
            .or_else(|| compat.set.get(name).cloned())
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::CheckConfig {
            path,
            merge_domain_config,
            limits,
        } => {
            let options = load_options(merge_domain_config, HeaderFormat::None, limits.limits());
            report(app::check_config(&path, options).map(|summary| format!("{summary}\n")))
        }
        Command::Explain {
            config,
            domain,
            descriptors,
            bucket,
        } => report(app::explain(&config, &domain, &descriptors, &bucket)),
        Command::Serve(args) => {
            let matches = matches.subcommand_matches("serve");
            serve_command(*args, &compat, matches, &variable)
        }
    }
}

/// A command's output on stdout (success), or its error on stderr (failure).
fn report(result: Result<String, impl std::fmt::Display>) -> ExitCode {
    match result {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("{err}");
            ExitCode::FAILURE
        }
    }
}

/// `sluice serve`: logging first, then what the translation of envoyproxy/ratelimit's
/// variables said (a variable that cannot be honoured stops the start), then [`serve`].
fn serve_command(
    args: ServeArgs,
    compat: &Translation,
    matches: Option<&ArgMatches>,
    variable: &dyn Fn(&str) -> Option<String>,
) -> ExitCode {
    init_logging(args.log_format, variable("SLUICE_LOG").as_deref());
    for name in compat.set.keys() {
        tracing::info!("{name} set from an envoyproxy/ratelimit variable");
    }
    for note in &compat.notes {
        tracing::warn!("envoyproxy/ratelimit variable: {note}");
    }
    if !compat.errors.is_empty() {
        for error in &compat.errors {
            tracing::error!("envoyproxy/ratelimit variable: {error}");
        }
        return ExitCode::FAILURE;
    }
    let redis_given = matches
        .map(|m| redis_settings_given(m, &compat.set, variable))
        .unwrap_or_default();
    match serve(args, &redis_given, variable) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, level: Option<&str>) {
    sluice::logging::init(matches!(format, LogFormat::Json), level);
}

#[tokio::main]
async fn serve(
    args: ServeArgs,
    redis_given: &[String],
    variable: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<()> {
    let settings = args.settings(redis_given, variable)?;
    let server = Server::build(settings)?;
    let signals = shutdown_signals()?;
    let mut listeners = Listeners::bind(args.ports.grpc_addr, args.ports.admin_addr).await?;
    if let Some(addr) = args.ports.metrics_addr {
        listeners = listeners.with_metrics(addr).await?;
    }
    server.run_until_signalled(listeners, signals).await?;
    Ok(())
}

/// Registers the SIGTERM (Kubernetes) and SIGINT handlers now, and returns the stream of
/// either signal: the first requests shutdown, the next skips the rest of the drain delay.
/// Registering before the listeners are announced matters: a signal that arrived before a
/// lazily registered handler would kill the process instead of draining it.
fn shutdown_signals() -> anyhow::Result<impl futures_util::Stream<Item = ()>> {
    #[cfg(unix)]
    {
        use anyhow::Context;
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).context("registering SIGTERM")?;
        let int = signal(SignalKind::interrupt()).context("registering SIGINT")?;
        Ok(futures_util::stream::unfold(
            (term, int),
            |(mut term, mut int)| async move {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
                Some(((), (term, int)))
            },
        ))
    }
    #[cfg(not(unix))]
    {
        Ok(futures_util::stream::unfold((), |()| async {
            let _ = tokio::signal::ctrl_c().await;
            Some(((), ()))
        }))
    }
}
