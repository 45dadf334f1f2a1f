//! The one file watcher: whatever sluice reloads from disk while it serves (the limits, the
//! gRPC server's certificates) is polled here, swapped in when its content changed and loads,
//! and reported once when it changed and does not.
//!
//! Why polling and not inotify (the `notify` crate): a Kubernetes ConfigMap or Secret volume
//! changes by the kubelet writing a new `..TIMESTAMP` directory and renaming a `..data` symlink
//! over the old one; the visible `edge.yaml` or `tls.crt` is a symlink through `..data`, so the
//! file a watcher would watch never changes, and inotify on bind mounts and overlay filesystems
//! misses events in some runtimes. notify's own polling watcher compares modification times
//! (or whole contents read with plain blocking reads, a FIFO at the path hanging it), and its
//! events would still need a fingerprint to tell content already reported from news. Reading a
//! few small files once a second costs nothing next to the decisions, sees every way a file
//! can change (symlink swap, rename, in-place edit, editors' replace-on-save), and needs no
//! extra dependency: each [`Source`] reads its files as its loader does and digests them
//! into a [`Fingerprint`].
//!
//! Why report once ([`Seen`], a pure model with the fingerprints passed in): a broken file
//! stays broken for many polls, and a line (and a failure counted) per poll would bury the
//! one that matters. The same broken content, or the same read failure, is reported once;
//! back at the files that serve, a later breakage is news again.
//!
//! Why a plain thread and not a task ([`run`]): a poll is blocking file I/O, and a runtime
//! waits for its blocking tasks when it shuts down. The thread wakes at once when stopped; a
//! poll still stuck in the file system after [`EXIT_GRACE`] is left behind (the process exits
//! without it), so whatever the file system does to a read can never hold up shutdown.

use std::fmt::{Debug, Display};
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

/// A digest of what a [`Source`] read: equal digests, equal content.
pub type Fingerprint = [u8; 32];

/// Files a [`Watcher`] polls: read, loaded and swapped in by the source, in those steps.
pub trait Source {
    /// What one read found, kept for the load (the bytes, or the directory to load from).
    type Files;
    /// What the files load into, swapped in whole.
    type Loaded: Debug;
    type Error: Display + Debug;

    /// Reads the files now (blocking I/O): what they hold and its fingerprint.
    fn read(&mut self) -> Result<(Fingerprint, Self::Files), Self::Error>;

    /// What `files` load into, or why they do not. Nothing is swapped in yet.
    fn load(&mut self, files: &Self::Files) -> Result<Self::Loaded, Self::Error>;

    /// Whether `files` (with `print`) are still what the paths hold: a read that straddled a
    /// swap may mix two generations, or belong to one already gone.
    fn settled(&mut self, files: &Self::Files, print: Fingerprint) -> bool;

    /// Serves `loaded` from now on.
    fn apply(&mut self, loaded: &Self::Loaded);

    /// Logs (and counts) what a poll did; called by [`run`] after every poll.
    fn report(&self, poll: Poll<Self::Loaded, Self::Error>);
}

/// What one poll did.
#[derive(Debug)]
pub enum Poll<T, E> {
    /// Nothing new: the files that serve, or a failure already reported.
    Unchanged,
    /// New content loaded and swapped in.
    Reloaded(T),
    /// New content that does not load, or files that cannot be read; what serves keeps
    /// serving. Reported once per content (per message for a read failure).
    Rejected(E),
    /// The files changed while they were read: nothing swapped in or reported, the next poll
    /// reads them again.
    Unsettled,
}

/// Which content serves and which failure was reported last: the report-once logic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    serving: Option<Fingerprint>,
    reported: Option<Fingerprint>,
}

impl Seen {
    /// `serving`: the fingerprint of what serves now; `None` when it could not be taken (then
    /// the first content read is news).
    pub fn new(serving: Option<Fingerprint>) -> Self {
        Seen {
            serving,
            reported: None,
        }
    }

    /// Whether content with `print` is worth loading: neither what serves nor what was last
    /// reported broken. Back at what serves, the next failure is news again.
    pub fn is_news(&mut self, print: Fingerprint) -> bool {
        if self.serving == Some(print) {
            self.reported = None;
            return false;
        }
        self.reported != Some(print)
    }

    /// Content with `print` now serves.
    pub fn served(&mut self, print: Fingerprint) {
        self.serving = Some(print);
        self.reported = None;
    }

    /// A failure known by `print` (the content's, or [`Seen::failure_print`]'s); whether it is
    /// to be reported, that is, it is not the one reported last.
    pub fn failed(&mut self, print: Fingerprint) -> bool {
        let news = self.reported != Some(print);
        self.reported = Some(print);
        news
    }

    /// The fingerprint of a read failure: its message (a file missing, then unreadable, is
    /// reported twice; the same message again is not).
    pub fn failure_print(message: &str) -> Fingerprint {
        let mut hash = Sha256::new();
        hash.update(b"read failure\0");
        hash.update(message.as_bytes());
        hash.finalize().into()
    }
}

/// A [`Source`] and what it has [`Seen`].
pub struct Watcher<S> {
    source: S,
    seen: Seen,
}

impl<S: Source> Watcher<S> {
    /// Watches `source`, whose content with fingerprint `serving` serves now.
    pub fn new(source: S, serving: Option<Fingerprint>) -> Self {
        Watcher {
            source,
            seen: Seen::new(serving),
        }
    }

    /// Takes `print` as the fingerprint of what serves.
    pub fn with_serving(mut self, print: Fingerprint) -> Self {
        self.seen = Seen::new(Some(print));
        self
    }

    /// The source, to watch it anew.
    pub fn into_source(self) -> S {
        self.source
    }

    /// One poll: blocking file I/O, never on a runtime's thread (see [`run`]).
    pub fn poll(&mut self) -> Poll<S::Loaded, S::Error> {
        let (print, files) = match self.source.read() {
            Ok(read) => read,
            Err(error) => {
                let news = self.seen.failed(Seen::failure_print(&error.to_string()));
                return if news {
                    Poll::Rejected(error)
                } else {
                    Poll::Unchanged
                };
            }
        };
        if !self.seen.is_news(print) {
            return Poll::Unchanged;
        }
        let loaded = self.source.load(&files);
        // Checked before either outcome counts: a load that failed on a torn read (the new
        // certificate with the old key) is no more news than one that succeeded on it.
        if !self.source.settled(&files, print) {
            return Poll::Unsettled;
        }
        match loaded {
            Ok(loaded) => {
                self.source.apply(&loaded);
                self.seen.served(print);
                Poll::Reloaded(loaded)
            }
            Err(error) => {
                self.seen.failed(print);
                Poll::Rejected(error)
            }
        }
    }
}

/// How long [`run`] waits, once stopped, for a poll under way to return.
pub const EXIT_GRACE: Duration = Duration::from_secs(1);

/// Polls `watcher` every `interval` on a thread of its own (`sluice-watch-NAME`), reporting
/// each poll through its source, until `stop` is cancelled; resolves once the thread has
/// ended, or [`EXIT_GRACE`] after `stop` when a poll is stuck. An error: the thread could not
/// be started, nothing is watched.
pub async fn run<S>(
    name: &'static str,
    mut watcher: Watcher<S>,
    interval: Duration,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    S: Source + Send + 'static,
{
    // A zero period would spin.
    let interval = interval.max(Duration::from_millis(1));
    // Dropping `wake` (on cancellation, or when this future is dropped) ends the thread's wait.
    let (wake, woken) = std::sync::mpsc::channel::<()>();
    let (ended, thread_ended) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("sluice-watch-{name}"))
        .spawn(move || {
            // Nothing is ever sent: the wait ends by the interval (poll) or a disconnect (stop).
            while let Err(RecvTimeoutError::Timeout) = woken.recv_timeout(interval) {
                let poll = watcher.poll();
                watcher.source.report(poll);
            }
            let _ = ended.send(());
        })?;
    let mut thread_ended = std::pin::pin!(thread_ended);
    tokio::select! {
        _ = thread_ended.as_mut() => return Ok(()),
        () = stop.cancelled() => {}
    }
    drop(wake);
    if tokio::time::timeout(EXIT_GRACE, thread_ended)
        .await
        .is_err()
    {
        tracing::warn!(
            watcher = name,
            "a poll is still reading the files; shutdown does not wait for it"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
