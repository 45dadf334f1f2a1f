//! Hot reload of the limits: polls the config path once per interval and swaps a new config
//! generation into the engine when the content changed and the whole new config is valid.
//!
//! Why polling and not inotify (`notify`): a Kubernetes ConfigMap volume changes by the kubelet
//! writing a new `..TIMESTAMP` directory and renaming a `..data` symlink over the old one; the
//! visible `edge.yaml` is a symlink through `..data`, so the file a watcher would watch never
//! changes, and inotify on bind mounts and overlay filesystems misses events in some runtimes.
//! Reading a few small files once a second costs nothing next to the decisions, sees every
//! way a file can change (symlink swap, rename, in-place edit, editors' replace-on-save), and
//! needs no extra dependency. The polls run on one thread of their own ([`watch`]), which
//! shutdown waits for only briefly; files are read as the loader reads them (regular files only,
//! non-blocking, within `--max-config-bytes`), so a FIFO or a device at the path is an error at
//! once, never a hung or endless read.
//!
//! Why resolve `..data` first: the kubelet may swap it between two file reads, and a directory
//! read through it file by file could then mix two generations. When the directory has a
//! `..data` entry the whole load goes through its resolved target, a timestamped directory the
//! kubelet never changes after the swap. The engine then swaps one complete [`Config`] at once,
//! so a request sees either the old or the new generation, never parts of both. An invalid new
//! config is logged (every error with file, line and rule), counted, and ignored: the previous
//! generation keeps serving until a valid one appears.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::decision::Engine;
use crate::metrics;

/// The kubelet's pointer to the current generation of a ConfigMap volume.
const KUBELET_DATA: &str = "..data";

/// Where and how often to look for changes.
#[derive(Debug, Clone)]
pub struct ReloadSettings {
    pub path: PathBuf,
    pub interval: Duration,
    /// The options the start-up config was loaded with; every reload uses the same.
    pub load_options: LoadOptions,
    /// [`fingerprint`] of the config taken before the start-up load ([`Reloader::fingerprint`]):
    /// a change made while sluice starts is then seen by the first poll. `None`: taken when the
    /// watcher starts.
    pub loaded: Option<[u8; 32]>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(ConfigErrors),
    #[error("the config changed while it was read; retrying")]
    Raced,
}

/// What one poll did.
#[derive(Debug)]
pub enum Poll {
    Unchanged,
    Reloaded { config: Arc<Config> },
    Rejected(ReloadError),
}

/// The directory (or file) to read one consistent generation from: the resolved `..data`
/// target when `path` is a ConfigMap-style directory, else `path` itself.
pub fn snapshot_source(path: &Path) -> Result<PathBuf, ReloadError> {
    let data = path.join(KUBELET_DATA);
    match std::fs::symlink_metadata(&data) {
        Ok(_) => {
            std::fs::canonicalize(&data).map_err(|source| ReloadError::Io { path: data, source })
        }
        Err(_) => Ok(path.to_path_buf()),
    }
}

/// A digest of what [`Config::load`] would read from `source`: every loaded file's name and
/// bytes. A change of any file, of the set of files, or of the `..data` target changes it.
/// Files are read as the loader reads them (non-blocking, regular files only, at most
/// `max_bytes` in all): one it refuses enters the digest as its refusal.
pub fn fingerprint(source: &Path, max_bytes: u64) -> Result<[u8; 32], ReloadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReloadError::Io { path, source }
    };
    let meta = std::fs::metadata(source).map_err(io(source))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        for entry in std::fs::read_dir(source).map_err(io(source))? {
            let entry = entry.map_err(io(source))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Same selection as the loader: visible *.yaml / *.yml files.
            if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
                continue;
            }
            files.push((name, entry.path()));
        }
        files.sort();
    } else {
        files.push((String::new(), source.to_path_buf()));
    }
    let mut hasher = Sha256::new();
    let mut budget = max_bytes;
    for (name, path) in files {
        // The loader skips a dangling link or a directory named x.yaml, and reports a FIFO, a
        // device or a file over the budget: either way nothing more is read.
        let bytes = match crate::config::read_config_file(&path, &mut budget, max_bytes) {
            Ok(bytes) => bytes,
            Err(refusal) => refusal.into_bytes(),
        };
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(&bytes);
    }
    Ok(hasher.finalize().into())
}

/// Polls `path` and reloads `engine` on change. Owns the last seen fingerprint, so an invalid
/// config is reported once, not once per poll.
pub struct Reloader {
    path: PathBuf,
    engine: Arc<Engine>,
    options: LoadOptions,
    last: Option<[u8; 32]>,
    /// The last read failure, so a missing path is reported once, not once per poll.
    last_failure: Option<String>,
}

impl Reloader {
    /// `path` is the config the engine was started with; its current content is taken as
    /// already loaded.
    pub fn new(path: PathBuf, engine: Arc<Engine>) -> Self {
        let mut reloader = Reloader {
            path,
            engine,
            options: LoadOptions::default(),
            last: None,
            last_failure: None,
        };
        reloader.last = reloader.current_print();
        reloader
    }

    /// Loads every generation with `options` (as the start-up config was).
    pub fn with_options(mut self, options: LoadOptions) -> Self {
        self.options = options;
        self.last = self.current_print();
        self
    }

    /// Takes `loaded` as the fingerprint of what the engine serves (see
    /// [`ReloadSettings::loaded`]).
    pub fn with_loaded(mut self, loaded: [u8; 32]) -> Self {
        self.last = Some(loaded);
        self
    }

    fn current_print(&self) -> Option<[u8; 32]> {
        Self::fingerprint(&self.path, &self.options)
    }

    /// The fingerprint of the config at `path` now, as a reloader with `options` takes it;
    /// `None` when it cannot be read.
    pub fn fingerprint(path: &Path, options: &LoadOptions) -> Option<[u8; 32]> {
        snapshot_source(path)
            .and_then(|source| fingerprint(&source, options.limits.max_bytes))
            .ok()
    }

    /// One poll: blocking file I/O, never on a runtime's thread (see [`watch`]).
    pub fn poll(&mut self) -> Poll {
        let source = match snapshot_source(&self.path) {
            Ok(source) => source,
            Err(err) => return self.reject_once(None, err),
        };
        let print = match fingerprint(&source, self.options.limits.max_bytes) {
            Ok(print) => print,
            Err(err) => return self.reject_once(None, err),
        };
        if self.last == Some(print) {
            return Poll::Unchanged;
        }
        let config = match Config::load_with(&source, self.options) {
            Ok(config) => config,
            Err(errors) => return self.reject_once(Some(print), ReloadError::Invalid(errors)),
        };
        // The kubelet swapped again while we read: the loaded files may belong to a generation
        // that is already gone. Its own directory is still consistent, but the next poll will
        // see the newer one; not swapping now avoids serving a generation twice removed.
        if snapshot_source(&self.path).ok().as_deref() != Some(source.as_path()) {
            return Poll::Rejected(ReloadError::Raced);
        }
        let config = Arc::new(config);
        self.engine.replace_config_arc(config.clone());
        self.last = Some(print);
        self.last_failure = None;
        Poll::Reloaded { config }
    }

    /// Remembers a failing fingerprint so the same broken content is reported once.
    fn reject_once(&mut self, print: Option<[u8; 32]>, err: ReloadError) -> Poll {
        if print.is_some() {
            if self.last == print {
                return Poll::Unchanged;
            }
        } else {
            let text = err.to_string();
            if self.last_failure.as_deref() == Some(text.as_str()) {
                return Poll::Unchanged;
            }
            self.last_failure = Some(text);
        }
        self.last = print;
        Poll::Rejected(err)
    }
}

/// How long [`watch`] waits, once stopped, for a poll under way to return.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Runs [`Reloader::poll`] every `interval` on a thread of its own until `stop` is cancelled,
/// logging and counting each reload or rejection; resolves once the thread has ended.
///
/// Why a plain thread and not a task: a poll is blocking file I/O, and a runtime waits for its
/// blocking tasks when it shuts down. The thread wakes at once when `stop` is cancelled; a poll
/// still stuck in the file system after [`EXIT_GRACE`] is left behind (the process exits
/// without it), so whatever the file system does to a read can never hold up shutdown.
pub async fn watch(settings: ReloadSettings, engine: Arc<Engine>, stop: CancellationToken) {
    // Dropping `wake` (on cancellation, or when this future is dropped) ends the thread's wait.
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let (ended, thread_ended) = tokio::sync::oneshot::channel::<()>();
    let started = std::thread::Builder::new()
        .name("sluice-reload".into())
        .spawn(move || {
            watch_loop(settings, engine, &woken);
            let _ = ended.send(());
        });
    if let Err(err) = started {
        metrics::record_config_failed();
        tracing::error!(error = %err, "cannot start the config watcher; reloads are off");
        return;
    }
    let mut thread_ended = std::pin::pin!(thread_ended);
    tokio::select! {
        _ = thread_ended.as_mut() => return,
        () = stop.cancelled() => {}
    }
    drop(wake);
    if tokio::time::timeout(EXIT_GRACE, thread_ended)
        .await
        .is_err()
    {
        tracing::warn!("the config watcher is still reading the config; not waiting for it");
    }
}

fn watch_loop(settings: ReloadSettings, engine: Arc<Engine>, woken: &Receiver<()>) {
    let mut reloader =
        Reloader::new(settings.path.clone(), engine).with_options(settings.load_options);
    if let Some(loaded) = settings.loaded {
        reloader = reloader.with_loaded(loaded);
    }
    tracing::info!(
        path = %settings.path.display(),
        interval_ms = settings.interval.as_millis() as u64,
        "watching the config for changes"
    );
    // Nothing is ever sent: the wait ends by the interval (poll) or a disconnect (stop).
    while let Err(RecvTimeoutError::Timeout) = woken.recv_timeout(settings.interval) {
        report(&settings.path, reloader.poll());
    }
}

fn report(path: &Path, poll: Poll) {
    match poll {
        Poll::Unchanged => {}
        Poll::Reloaded { config } => {
            let unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            metrics::record_config_loaded(path, &config, unix_now);
        }
        Poll::Rejected(ReloadError::Raced) => {
            tracing::debug!(path = %path.display(), "config changed during reload; retrying");
        }
        Poll::Rejected(ReloadError::Invalid(errors)) => {
            metrics::record_config_failed();
            // Each error as `sluice check-config` and a failed start-up print it:
            // `FILE:LINE: RULE: MESSAGE`, a parser error included.
            for error in errors.iter() {
                tracing::error!(
                    error = %error,
                    "config reload rejected; keeping the previous config"
                );
            }
        }
        Poll::Rejected(err) => {
            metrics::record_config_failed();
            tracing::error!(
                path = %path.display(),
                error = %err,
                "config reload failed; keeping the previous config"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::SystemClock;
    use crate::limiter::memory::MemoryLimiter;
    use crate::logging::tests::Captured;

    fn limits(rpu: u32) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
        )
    }

    /// Writes a kubelet-style generation and points `..data` at it atomically.
    fn publish(dir: &Path, stamp: &str, files: &[(&str, String)]) {
        let generation = dir.join(stamp);
        std::fs::create_dir(&generation).unwrap();
        for (name, text) in files {
            std::fs::write(generation.join(name), text).unwrap();
            let visible = dir.join(name);
            if std::fs::symlink_metadata(&visible).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &visible).unwrap();
            }
        }
        let tmp = dir.join("..data_tmp");
        std::os::unix::fs::symlink(stamp, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    }

    fn limit_of(engine: &Engine) -> u32 {
        let config = engine.config();
        match config.lookup("d", &[crate::descriptor::Entry::new("k", "v")]) {
            crate::config::Lookup::Rule { rule, .. } => match rule.limit {
                Some(crate::config::LimitSpec::PerUnit {
                    requests_per_unit, ..
                }) => requests_per_unit,
                other => panic!("unexpected limit {other:?}"),
            },
            other => panic!("no rule: {other:?}"),
        }
    }

    #[test]
    fn symlink_swap_reloads_and_invalid_keeps_the_old_generation() {
        let dir = tempfile::tempdir().unwrap();
        publish(
            dir.path(),
            "..2026_01_01_00_00_00.1",
            &[("d.yaml", limits(3))],
        );
        let config = Config::load(dir.path()).unwrap();
        let engine = Arc::new(Engine::new(
            config,
            Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        ));
        let mut reloader = Reloader::new(dir.path().to_path_buf(), engine.clone());
        assert!(matches!(reloader.poll(), Poll::Unchanged));

        publish(
            dir.path(),
            "..2026_01_01_00_01_00.2",
            &[("d.yaml", limits(7))],
        );
        assert!(matches!(reloader.poll(), Poll::Reloaded { .. }));
        assert_eq!(limit_of(&engine), 7);
        assert!(matches!(reloader.poll(), Poll::Unchanged));

        publish(
            dir.path(),
            "..2026_01_01_00_02_00.3",
            &[(
                "d.yaml",
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n".into(),
            )],
        );
        match reloader.poll() {
            Poll::Rejected(ReloadError::Invalid(errors)) => {
                let e = &errors.0[0];
                assert_eq!((e.line, e.rule.as_str()), (Some(4), "k"));
                assert!(e.file.to_string_lossy().contains("..2026_01_01_00_02_00.3"));
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        assert_eq!(limit_of(&engine), 7, "the old generation keeps serving");
        // Reported once, not on every poll.
        assert!(matches!(reloader.poll(), Poll::Unchanged));

        // A second file in a new generation arrives together with a change to the first.
        publish(
            dir.path(),
            "..2026_01_01_00_03_00.4",
            &[
                ("d.yaml", limits(9)),
                ("e.yaml", "domain: e\ndescriptors: []\n".into()),
            ],
        );
        assert!(matches!(reloader.poll(), Poll::Reloaded { .. }));
        assert_eq!(limit_of(&engine), 9);
        assert!(engine.config().has_domain("e"));
    }

    /// A plain file `d.yaml` with `limits(3)`, loaded into an engine a reloader watches.
    fn watched_file() -> (tempfile::TempDir, PathBuf, Arc<Engine>, Reloader) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.yaml");
        std::fs::write(&file, limits(3)).unwrap();
        let engine = Arc::new(Engine::new(
            Config::load(&file).unwrap(),
            Arc::new(MemoryLimiter::new(Arc::new(SystemClock))),
        ));
        let reloader = Reloader::new(file.clone(), engine.clone());
        (dir, file, engine, reloader)
    }

    #[test]
    fn a_yaml_parse_error_on_reload_is_logged_as_check_config_prints_it() {
        let (_dir, file, engine, mut reloader) = watched_file();
        // An unclosed flow mapping on line 4, inside descriptor `k`.
        let broken = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute\n";
        std::fs::write(&file, broken).unwrap();
        let poll = reloader.poll();

        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || report(&file, poll));
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();

        // The same text `sluice check-config` prints for this file.
        let check_config = Config::load(&file).unwrap_err().to_string();
        let prefix = format!("{}:4: k: malformed YAML: ", file.display());
        assert!(check_config.starts_with(&prefix), "{check_config}");
        let line = log
            .lines()
            .find(|l| l.contains("config reload rejected"))
            .unwrap_or_else(|| panic!("no rejection logged: {log}"));
        assert!(line.ends_with(&format!("error={check_config}")), "{line}");
        assert_eq!(limit_of(&engine), 3, "the old config keeps serving");
    }

    #[test]
    fn plain_file_edits_are_seen() {
        let (_dir, file, engine, mut reloader) = watched_file();
        std::fs::write(&file, limits(4)).unwrap();
        assert!(matches!(reloader.poll(), Poll::Reloaded { .. }));
        assert_eq!(limit_of(&engine), 4);
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            reloader.poll(),
            Poll::Rejected(ReloadError::Io { .. })
        ));
        assert!(matches!(reloader.poll(), Poll::Unchanged));
        assert_eq!(limit_of(&engine), 4);
        std::fs::write(&file, limits(4)).unwrap();
        assert!(matches!(reloader.poll(), Poll::Reloaded { .. }));
    }
}
