//! Hot reload of the limits: the config path, polled by the [`crate::watcher`] once per
//! interval, and a new config generation swapped into the engine when the content changed and
//! the whole new config is valid. Files are read as the loader reads them (regular files only,
//! non-blocking, within `--max-config-bytes`), so a FIFO or a device at the path is an error
//! at once, never a hung or endless read.
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
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::decision::Engine;
use crate::metrics;
use crate::watcher::{self, Fingerprint, Source, Watcher};

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
    pub loaded: Option<Fingerprint>,
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
}

/// What one poll did.
pub type Poll = watcher::Poll<Arc<Config>, ReloadError>;

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
pub fn fingerprint(source: &Path, max_bytes: u64) -> Result<Fingerprint, ReloadError> {
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

/// The config path as the [`crate::watcher`] polls it: read through the resolved `..data`
/// target, loaded with the start-up options, swapped into the engine.
pub struct ConfigFiles {
    path: PathBuf,
    engine: Arc<Engine>,
    options: LoadOptions,
}

impl Source for ConfigFiles {
    /// The directory (or file) the generation read is loaded from.
    type Files = PathBuf;
    type Loaded = Arc<Config>;
    type Error = ReloadError;

    fn read(&mut self) -> Result<(Fingerprint, PathBuf), ReloadError> {
        let source = snapshot_source(&self.path)?;
        let print = fingerprint(&source, self.options.limits.max_bytes)?;
        Ok((print, source))
    }

    fn load(&mut self, source: &PathBuf) -> Result<Arc<Config>, ReloadError> {
        Config::load_with(source, self.options)
            .map(Arc::new)
            .map_err(ReloadError::Invalid)
    }

    /// The kubelet swapped again while we read: the loaded files may belong to a generation
    /// that is already gone. Its own directory is still consistent, but the next poll will see
    /// the newer one; not swapping now avoids serving a generation twice removed.
    fn settled(&mut self, source: &PathBuf, _: Fingerprint) -> bool {
        snapshot_source(&self.path).ok().as_ref() == Some(source)
    }

    fn apply(&mut self, config: &Arc<Config>) {
        self.engine.replace_config_arc(config.clone());
    }

    fn report(&self, poll: Poll) {
        report(&self.path, poll);
    }
}

/// Polls `path` and reloads `engine` on change: the config's [`Watcher`].
pub struct Reloader {
    watcher: Watcher<ConfigFiles>,
}

impl Reloader {
    /// `path` is the config the engine was started with; its current content is taken as
    /// already loaded.
    pub fn new(path: PathBuf, engine: Arc<Engine>) -> Self {
        Self::watching(path, engine, LoadOptions::default())
    }

    fn watching(path: PathBuf, engine: Arc<Engine>, options: LoadOptions) -> Self {
        let serving = Self::fingerprint(&path, &options);
        let files = ConfigFiles {
            path,
            engine,
            options,
        };
        Reloader {
            watcher: Watcher::new(files, serving),
        }
    }

    /// Loads every generation with `options` (as the start-up config was).
    pub fn with_options(self, options: LoadOptions) -> Self {
        let ConfigFiles { path, engine, .. } = self.watcher.into_source();
        Self::watching(path, engine, options)
    }

    /// Takes `loaded` as the fingerprint of what the engine serves (see
    /// [`ReloadSettings::loaded`]).
    pub fn with_loaded(self, loaded: Fingerprint) -> Self {
        Reloader {
            watcher: self.watcher.with_serving(loaded),
        }
    }

    /// The fingerprint of the config at `path` now, as a reloader with `options` takes it;
    /// `None` when it cannot be read.
    pub fn fingerprint(path: &Path, options: &LoadOptions) -> Option<Fingerprint> {
        snapshot_source(path)
            .and_then(|source| fingerprint(&source, options.limits.max_bytes))
            .ok()
    }

    /// One poll: blocking file I/O, never on a runtime's thread (see [`watch`]).
    pub fn poll(&mut self) -> Poll {
        self.watcher.poll()
    }
}

/// Polls the config every `interval` until `stop` is cancelled, logging and counting each
/// reload or rejection ([`watcher::run`]: on a thread of its own, never holding up shutdown).
pub async fn watch(settings: ReloadSettings, engine: Arc<Engine>, stop: CancellationToken) {
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
    if let Err(err) = watcher::run("config", reloader.watcher, settings.interval, stop).await {
        metrics::record_config_failed();
        tracing::error!(error = %err, "cannot start the config watcher; reloads are off");
    }
}

fn report(path: &Path, poll: Poll) {
    match poll {
        Poll::Unchanged => {}
        Poll::Reloaded(config) => {
            let unix_now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            metrics::record_config_loaded(path, &config, unix_now);
        }
        Poll::Unsettled => {
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
        // Back: the config that serves, not news.
        std::fs::write(&file, limits(4)).unwrap();
        assert!(matches!(reloader.poll(), Poll::Unchanged));
        std::fs::write(&file, limits(5)).unwrap();
        assert!(matches!(reloader.poll(), Poll::Reloaded { .. }));
        assert_eq!(limit_of(&engine), 5);
    }
}
