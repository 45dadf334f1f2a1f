use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::*;

fn print(n: u8) -> Fingerprint {
    [n; 32]
}

#[test]
fn seen_reports_each_broken_content_once_and_forgets_it_back_at_what_serves() {
    let mut seen = Seen::new(Some(print(1)));
    assert!(!seen.is_news(print(1)), "what serves is not news");
    assert!(seen.is_news(print(2)));
    seen.served(print(2));
    assert!(!seen.is_news(print(2)));

    // Broken content: reported once.
    assert!(seen.is_news(print(3)));
    assert!(seen.failed(print(3)));
    assert!(!seen.is_news(print(3)), "the same broken content again");
    // Another broken content is news; then the first one is news again.
    assert!(seen.is_news(print(4)));
    assert!(seen.failed(print(4)));
    assert!(seen.is_news(print(3)));
    assert!(seen.failed(print(3)));
    // Back at what serves: the same breakage after it is news again.
    assert!(!seen.is_news(print(2)));
    assert!(seen.is_news(print(3)));

    // A read failure: once per message, whatever the content before it.
    let missing = Seen::failure_print("missing");
    assert!(seen.failed(missing));
    assert!(!seen.failed(missing));
    assert!(seen.failed(Seen::failure_print("denied")));
    assert!(seen.failed(missing));
    // The broken content after a read failure is reported again; what serves is not.
    assert!(seen.is_news(print(3)));
    assert!(!seen.is_news(print(2)));
}

#[test]
fn seen_without_a_serving_print_takes_any_content_as_news() {
    let mut seen = Seen::new(None);
    assert!(seen.is_news(print(1)));
    seen.served(print(1));
    assert!(!seen.is_news(print(1)));
}

/// One read as a scripted [`Source`] sees it: the content (a number: even loads, odd does
/// not) or a read failure, and whether a second read agrees.
#[derive(Clone, Copy)]
enum Read {
    Content(u8),
    Torn(u8),
    Fails(&'static str),
}

/// Reads what the script says; what it applies and reports is recorded.
struct Scripted {
    reads: VecDeque<Read>,
    applied: Arc<Mutex<Vec<u8>>>,
}

impl Source for Scripted {
    type Files = Read;
    type Loaded = u8;
    type Error = String;

    fn read(&mut self) -> Result<(Fingerprint, Read), String> {
        match self.reads.pop_front().expect("a scripted read") {
            Read::Fails(message) => Err(message.to_owned()),
            read @ (Read::Content(n) | Read::Torn(n)) => Ok((print(n), read)),
        }
    }

    fn load(&mut self, files: &Read) -> Result<u8, String> {
        match files {
            Read::Content(n) | Read::Torn(n) if n % 2 == 0 => Ok(*n),
            _ => Err("odd".to_owned()),
        }
    }

    fn settled(&mut self, files: &Read, _: Fingerprint) -> bool {
        !matches!(files, Read::Torn(_))
    }

    fn apply(&mut self, loaded: &u8) {
        self.applied.lock().unwrap().push(*loaded);
    }

    fn report(&self, _: Poll<u8, String>) {}
}

fn outcome(poll: Poll<u8, String>) -> String {
    match poll {
        Poll::Unchanged => "unchanged".into(),
        Poll::Reloaded(n) => format!("reloaded {n}"),
        Poll::Rejected(e) => format!("rejected {e}"),
        Poll::Unsettled => "unsettled".into(),
    }
}

#[test]
fn a_watcher_swaps_in_new_content_reports_failures_once_and_ignores_torn_reads() {
    use Read::*;
    let script = [
        (Content(2), "unchanged"),
        (Content(4), "reloaded 4"),
        (Content(4), "unchanged"),
        // A torn read is neither served nor reported, even when it would load (or not).
        (Torn(6), "unsettled"),
        (Torn(7), "unsettled"),
        (Content(7), "rejected odd"),
        (Content(7), "unchanged"),
        (Fails("gone"), "rejected gone"),
        (Fails("gone"), "unchanged"),
        (Content(4), "unchanged"),
        (Content(7), "rejected odd"),
        (Content(6), "reloaded 6"),
    ];
    let applied = Arc::new(Mutex::new(Vec::new()));
    let source = Scripted {
        reads: script.iter().map(|(read, _)| *read).collect(),
        applied: applied.clone(),
    };
    let mut watcher = Watcher::new(source, Some(print(2)));
    let seen: Vec<String> = script.iter().map(|_| outcome(watcher.poll())).collect();
    let expected: Vec<&str> = script.iter().map(|(_, outcome)| *outcome).collect();
    assert_eq!(seen, expected);
    assert_eq!(*applied.lock().unwrap(), vec![4, 6]);
}
