//! Where `serve`'s values come from besides the command line: envoyproxy/ratelimit's
//! variables, translated by `sluice::compat`, as the options' defaults; and which Redis-only
//! settings were given at all (refused without a Redis URL).

use std::collections::BTreeMap;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory};

use super::Cli;

/// The `serve` arguments that only mean something with a Redis URL.
const REDIS_ONLY: &[&str] = &[
    "redis_ca_file",
    "redis_password_file",
    "redis_tls_cert",
    "redis_tls_key",
    "redis_sentinel_user",
    "redis_sentinel_password_file",
    "redis_pool_size",
    "redis_batch_max",
    "redis_wait_replicas",
];

/// The variables that carry Redis secrets (no flag on purpose).
pub(super) const REDIS_SECRETS: &[&str] =
    &["SLUICE_REDIS_PASSWORD", "SLUICE_REDIS_SENTINEL_PASSWORD"];

/// `command` (and its subcommands) with each option whose variable `translated` holds (an
/// envoyproxy/ratelimit variable translated, see `sluice::compat`) defaulting to that value:
/// the option's flag and its own `SLUICE_*` variable still win, as clap ranks them above a
/// default. The process environment is left as it is.
pub(crate) fn with_translated_defaults(
    mut command: clap::Command,
    translated: &BTreeMap<String, String>,
) -> clap::Command {
    let defaults: Vec<(clap::Id, String, Option<char>)> = command
        .get_arguments()
        .filter_map(|arg| {
            let value = translated.get(arg.get_env()?.to_str()?)?;
            Some((
                arg.get_id().clone(),
                value.clone(),
                arg.get_value_delimiter(),
            ))
        })
        .collect();
    for (id, value, delimiter) in defaults {
        command = command.mut_arg(id, |arg| match delimiter {
            Some(d) => arg.default_values(value.split(d).map(str::to_owned)),
            None => arg.default_value(value),
        });
    }
    let subcommands: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    for name in subcommands {
        command = command.mut_subcommand(name, |s| with_translated_defaults(s, translated));
    }
    command
}

/// The variable an argument of `matches` is read from, by id, for `serve`.
fn env_of(id: &str) -> Option<String> {
    let command = Cli::command();
    let serve = command.find_subcommand("serve")?;
    let arg = serve.get_arguments().find(|a| a.get_id() == id)?;
    Some(arg.get_env()?.to_str()?.to_owned())
}

/// The Redis-only settings given (on the command line, in the environment or translated from
/// envoyproxy/ratelimit's variables, not defaults), as `--flag` or `VARIABLE` names.
/// `variable` reads the variables that have no flag.
pub(crate) fn redis_settings_given(
    matches: &ArgMatches,
    translated: &BTreeMap<String, String>,
    variable: &dyn Fn(&str) -> Option<String>,
) -> Vec<String> {
    let flags = REDIS_ONLY
        .iter()
        .filter(|id| match matches.value_source(id) {
            Some(ValueSource::CommandLine | ValueSource::EnvVariable) => true,
            Some(ValueSource::DefaultValue) => {
                env_of(id).is_some_and(|env| translated.contains_key(&env))
            }
            _ => false,
        })
        .map(|id| {
            let flag = id.replace('_', "-");
            format!("--{flag} (SLUICE_{})", id.to_ascii_uppercase())
        });
    let secrets = REDIS_SECRETS
        .iter()
        .filter(|name| variable(name).is_some_and(|v| !v.is_empty()))
        .map(|name| name.to_string());
    flags.chain(secrets).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;
    use clap::FromArgMatches;
    use std::path::PathBuf;

    /// The variables read without a flag: the Redis secrets and the log level.
    const FLAGLESS: &[&str] = &[
        "SLUICE_REDIS_PASSWORD",
        "SLUICE_REDIS_SENTINEL_PASSWORD",
        "SLUICE_LOG",
    ];

    fn options_variables(command: &clap::Command, out: &mut Vec<String>) {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env().and_then(|e| e.to_str()) {
                out.push(env.to_owned());
            }
        }
        for sub in command.get_subcommands() {
            options_variables(sub, out);
        }
    }

    /// Each `SLUICE_*` variable the translation of envoyproxy/ratelimit's environment names
    /// reaches the settings: as an option's default, or read directly (the flagless ones). A
    /// translated variable nothing reads would be dropped without a word.
    #[test]
    fn every_translated_variable_is_read() {
        let sources = [
            include_str!("../compat.rs"),
            include_str!("../compat/headers.rs"),
            include_str!("../compat/otel.rs"),
            include_str!("../compat/redis.rs"),
            include_str!("../compat/server.rs"),
            include_str!("../compat/xds.rs"),
        ];
        let mut read = Vec::new();
        options_variables(&Cli::command(), &mut read);
        read.extend(FLAGLESS.iter().map(|v| (*v).to_owned()));
        assert!(REDIS_SECRETS.iter().all(|s| FLAGLESS.contains(s)));
        let mut named = 0;
        for source in sources {
            for piece in source.split('"').skip(1).step_by(2) {
                if piece.starts_with("SLUICE_") && !piece.contains(' ') {
                    named += 1;
                    assert!(
                        read.iter().any(|r| r == piece),
                        "{piece} is read by nothing"
                    );
                }
            }
        }
        assert!(
            named > 30,
            "only {named} variables found in the compat sources"
        );
    }

    fn parse(translated: &[(&str, &str)], args: &[&str]) -> Cli {
        let translated = translated
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let matches = with_translated_defaults(Cli::command(), &translated)
            .try_get_matches_from(args)
            .unwrap();
        Cli::from_arg_matches(&matches).unwrap()
    }

    /// A translated value is the option's default: it applies when nothing else is given,
    /// a flag wins over it, lists split on their delimiter, switches turn on, and every
    /// subcommand reading the variable gets it.
    #[test]
    fn translated_values_are_defaults_below_flags() {
        let translated = [
            ("SLUICE_CONFIG", "/data/ratelimit/config"),
            ("SLUICE_GRPC_ADDR", "0.0.0.0:8081"),
            ("SLUICE_ADMIN_ADDR", "0.0.0.0:8080"),
            ("SLUICE_SHADOW_MODE", "true"),
            ("SLUICE_MERGE_DOMAIN_CONFIG", "true"),
            ("SLUICE_WATCH_CONFIG", "false"),
            ("SLUICE_GRPC_TLS_CERT", "/tls/cert.pem"),
            ("SLUICE_GRPC_TLS_KEY", "/tls/key.pem"),
            ("SLUICE_GRPC_CLIENT_CA", "/tls/a.pem,/tls/b.pem"),
        ];
        let cli = parse(
            &translated,
            &["sluice", "serve", "--admin-addr", "127.0.0.1:9"],
        );
        let Command::Serve(args) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(
            args.config.config.as_deref(),
            Some(std::path::Path::new("/data/ratelimit/config"))
        );
        assert_eq!(args.ports.grpc_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(args.ports.admin_addr.to_string(), "127.0.0.1:9");
        let config = &args.config;
        assert!(args.engine.shadow_mode && config.merge_domain_config && !config.watch_config);
        assert_eq!(
            args.grpc_tls.grpc_client_ca,
            [PathBuf::from("/tls/a.pem"), PathBuf::from("/tls/b.pem")]
        );
        let cli = parse(&translated, &["sluice", "check-config", "/etc/limits"]);
        let Command::CheckConfig {
            merge_domain_config,
            ..
        } = cli.command
        else {
            panic!("not check-config");
        };
        assert!(merge_domain_config);
        // Nothing translated: the options' own defaults.
        let Command::Serve(args) = parse(&[], &["sluice", "serve"]).command else {
            panic!("not serve");
        };
        assert_eq!(args.ports.grpc_addr.to_string(), "127.0.0.1:8081");
        let config = &args.config;
        assert!(!args.engine.shadow_mode && config.watch_config && config.config.is_none());
    }
}
