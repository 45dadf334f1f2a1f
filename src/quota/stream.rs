//! One RLQS stream's state: its domain and, per bucket, how long it has been idle and the token
//! bucket it was last sent. Pure (the reports carry their own times), and bounded: at most
//! `max_buckets` buckets per stream (`--rlqs-max-buckets`), each forgotten when abandoned.
//!
//! Why per stream and so little: a stream is one Envoy and one domain, and what a bucket may be
//! granted depends on the shared window, which lives in the limiter; the stream only has to
//! know what it told its Envoy (two assignments in a row must differ, see `sizing`) and when a
//! bucket has been idle long enough to be abandoned. A stream that ends takes its state with
//! it: Envoy's next stream reports every bucket again, each starting afresh here.

use std::collections::HashMap;

use super::sizing::Demand;
use super::{Assignment, BucketId, IDLE_REPORTS_BEFORE_ABANDON, TokenBucket, Usage};

/// What one usage line says about its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Its demand.
    Demand(Demand),
    /// Idle for [`IDLE_REPORTS_BEFORE_ABANDON`] reports in a row: forgotten here, to be
    /// abandoned.
    Abandon,
    /// A bucket the stream does not track, which already tracks `max_buckets`: not tracked.
    Full,
}

#[derive(Debug, Clone, Default)]
struct Bucket {
    /// Reports in a row without a request.
    idle: u32,
    /// The token bucket of the last assignment sent, if it was one.
    last: Option<TokenBucket>,
}

/// One stream's buckets.
#[derive(Debug)]
pub struct Stream {
    domain: Option<String>,
    buckets: HashMap<BucketId, Bucket>,
    max_buckets: usize,
}

impl Stream {
    pub fn new(max_buckets: usize) -> Self {
        Stream {
            domain: None,
            buckets: HashMap::new(),
            max_buckets,
        }
    }

    /// The domain of the stream's first report.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    pub fn set_domain(&mut self, domain: String) {
        self.domain = Some(domain);
    }

    /// Buckets tracked.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Takes one usage line. A bucket's demand is its requests (allowed and denied) per second
    /// since its previous report; a report less than a second after the previous one (Envoy
    /// says 0 s) counts as a second; the first report of a bucket new to the stream, with no
    /// time of its own, is [`Demand::First`].
    pub fn observe(&mut self, usage: &Usage) -> Observed {
        let new = !self.buckets.contains_key(&usage.bucket);
        if new && self.buckets.len() >= self.max_buckets {
            return Observed::Full;
        }
        let bucket = self.buckets.entry(usage.bucket.clone()).or_default();
        let requests = usage.allowed.saturating_add(usage.denied);
        if requests > 0 {
            bucket.idle = 0;
        } else if usage.elapsed_s > 0 {
            bucket.idle += 1;
            if bucket.idle >= IDLE_REPORTS_BEFORE_ABANDON {
                self.buckets.remove(&usage.bucket);
                return Observed::Abandon;
            }
        }
        if new && usage.elapsed_s == 0 {
            return Observed::Demand(Demand::First);
        }
        Observed::Demand(Demand::Rate {
            requests,
            seconds: usage.elapsed_s.max(1),
        })
    }

    /// The token bucket `bucket` was last sent, if its last assignment was one.
    pub fn last(&self, bucket: &BucketId) -> Option<TokenBucket> {
        self.buckets.get(bucket).and_then(|b| b.last)
    }

    /// Notes what `bucket` was sent (nothing, when `None`: the assignment Envoy holds stays).
    pub fn sent(&mut self, bucket: &BucketId, assignment: Option<Assignment>) {
        let Some(assignment) = assignment else {
            return;
        };
        if let Some(state) = self.buckets.get_mut(bucket) {
            state.last = match assignment {
                Assignment::Tokens(tokens) => Some(tokens),
                Assignment::AllowAll | Assignment::DenyAll | Assignment::Abandon => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(client: &str, allowed: u64, denied: u64, elapsed_s: u64) -> Usage {
        Usage {
            bucket: BucketId::from([("client".to_owned(), client.to_owned())]),
            allowed,
            denied,
            elapsed_s,
        }
    }

    #[test]
    fn demand_is_requests_per_second_since_the_last_report() {
        let mut stream = Stream::new(10);
        assert_eq!(
            stream.observe(&usage("a", 1, 0, 0)),
            Observed::Demand(Demand::First)
        );
        assert_eq!(
            stream.observe(&usage("a", 40, 10, 5)),
            Observed::Demand(Demand::Rate {
                requests: 50,
                seconds: 5
            })
        );
        // Under a second since the last report: counted as one.
        assert_eq!(
            stream.observe(&usage("a", 3, 0, 0)),
            Observed::Demand(Demand::Rate {
                requests: 3,
                seconds: 1
            })
        );
        // A bucket new to this stream but known to Envoy (a new stream) has a time.
        assert_eq!(
            stream.observe(&usage("b", 10, 0, 5)),
            Observed::Demand(Demand::Rate {
                requests: 10,
                seconds: 5
            })
        );
    }

    #[test]
    fn idle_buckets_are_abandoned_and_forgotten() {
        let mut stream = Stream::new(10);
        stream.observe(&usage("a", 1, 0, 0));
        for _ in 1..IDLE_REPORTS_BEFORE_ABANDON {
            assert_eq!(
                stream.observe(&usage("a", 0, 0, 5)),
                Observed::Demand(Demand::Rate {
                    requests: 0,
                    seconds: 5
                })
            );
        }
        // A request resets the count.
        stream.observe(&usage("a", 0, 1, 5));
        for _ in 1..IDLE_REPORTS_BEFORE_ABANDON {
            stream.observe(&usage("a", 0, 0, 5));
        }
        assert_eq!(stream.observe(&usage("a", 0, 0, 5)), Observed::Abandon);
        assert!(stream.is_empty());
    }

    #[test]
    fn buckets_past_the_bound_are_not_tracked() {
        let mut stream = Stream::new(2);
        stream.observe(&usage("a", 1, 0, 0));
        stream.observe(&usage("b", 1, 0, 0));
        assert_eq!(stream.observe(&usage("c", 1, 0, 0)), Observed::Full);
        assert_eq!(stream.len(), 2);
        // Known buckets go on.
        assert_eq!(
            stream.observe(&usage("a", 5, 0, 5)),
            Observed::Demand(Demand::Rate {
                requests: 5,
                seconds: 5
            })
        );
    }

    #[test]
    fn the_last_token_bucket_sent_is_kept() {
        let mut stream = Stream::new(2);
        let a = usage("a", 1, 0, 0);
        stream.observe(&a);
        let tokens = TokenBucket {
            max_tokens: 5,
            tokens_per_fill: 5,
            fill_interval_s: 60,
        };
        stream.sent(&a.bucket, Some(Assignment::Tokens(tokens)));
        assert_eq!(stream.last(&a.bucket), Some(tokens));
        stream.sent(&a.bucket, None);
        assert_eq!(stream.last(&a.bucket), Some(tokens));
        stream.sent(&a.bucket, Some(Assignment::DenyAll));
        assert_eq!(stream.last(&a.bucket), None);
    }
}
