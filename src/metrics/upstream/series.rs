//! What a stat becomes on the Prometheus page: the [`Series`] the mapping names (family,
//! labels, help, and for a timer whether it is a histogram or a summary), and for a timer its
//! [`Observations`].
//!
//! Why apart from the rendering: the mapper makes series, the store keeps observations, the
//! page renders both; each of those needs these types, none needs the others' logic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Prometheus' default histogram buckets, statsd_exporter's default.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// client_golang's summary window (`MaxAge` 10 minutes in 5 age buckets).
const SUMMARY_MAX_AGE: Duration = Duration::from_secs(600);
const SUMMARY_AGE_BUCKETS: u32 = 5;
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// What an observed stat (a timer) becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObserverKind {
    Histogram,
    Summary,
}

/// The series a stat maps to.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub family: String,
    /// Sorted by name.
    pub labels: Vec<(String, String)>,
    pub help: String,
    /// For observed stats.
    pub observer: ObserverKind,
    /// Observed values are multiplied by this.
    pub scale: Option<f64>,
    /// A `drop` mapping, or a mapping whose name came out empty: not served.
    pub dropped: bool,
}

/// The observations of one timer, for its series.
pub struct Observations {
    pub series: Arc<Series>,
    pub histogram: Vec<u64>,
    pub sum: f64,
    pub count: u64,
    /// Summary windows: (start, value -> count), oldest first.
    windows: VecDeque<(Instant, BTreeMap<u64, u64>)>,
}

impl Observations {
    pub fn new(series: Arc<Series>) -> Observations {
        Observations {
            histogram: vec![0; DEFAULT_BUCKETS.len()],
            series,
            sum: 0.0,
            count: 0,
            windows: VecDeque::new(),
        }
    }

    /// One observation of `millis` (before the series' scale).
    pub fn observe(&mut self, millis: u64) {
        let value = self
            .series
            .scale
            .map_or(millis as f64, |s| millis as f64 * s);
        self.sum += value;
        self.count += 1;
        match self.series.observer {
            ObserverKind::Histogram => {
                for (bound, n) in DEFAULT_BUCKETS.iter().zip(&mut self.histogram) {
                    if value <= *bound {
                        *n += 1;
                    }
                }
            }
            ObserverKind::Summary => {
                let now = Instant::now();
                self.expire(now);
                let step = SUMMARY_MAX_AGE / SUMMARY_AGE_BUCKETS;
                if self
                    .windows
                    .back()
                    .is_none_or(|(start, _)| now.duration_since(*start) >= step)
                {
                    self.windows.push_back((now, BTreeMap::new()));
                }
                if let Some((_, values)) = self.windows.back_mut() {
                    *values.entry(millis).or_insert(0) += 1;
                }
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while self
            .windows
            .front()
            .is_some_and(|(start, _)| now.duration_since(*start) >= SUMMARY_MAX_AGE)
        {
            self.windows.pop_front();
        }
    }

    /// The value at quantile `q` of the window (nearest rank), NaN when it is empty.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
        for (_, values) in &self.windows {
            for (v, n) in values {
                *merged.entry(*v).or_insert(0) += n;
            }
        }
        let total: u64 = merged.values().sum();
        if total == 0 {
            return f64::NAN;
        }
        let rank = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (v, n) in &merged {
            seen += n;
            if seen >= rank {
                return self.series.scale.map_or(*v as f64, |s| *v as f64 * s);
            }
        }
        f64::NAN
    }
}
