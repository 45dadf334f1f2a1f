//! The aggregation both sinks read: a counter per stat (its total, and what the statsd sink has
//! sent of it), and per gRPC method the response times observed (pending for the statsd sink,
//! folded into a histogram or summary for the Prometheus page).
//!
//! Why one store: envoyproxy/ratelimit's stats go to statsd or to its Prometheus sink through
//! one gostats store, which sends each counter's increase since the last flush; keeping the
//! totals here lets the statsd sink send the same increases and the Prometheus page render the
//! same totals, from the same increments.
//!
//! Bounds: rate-limit keys that carry request values (`detailed_metric`, `value_to_metric`, a
//! request's `limit`) and unknown domains (`domain_not_found`) are client-chosen, so the store
//! holds at most `max_keys` of them; past that, a new one is folded into its rule's key without
//! values (or into `_overflow` for an override or an unknown domain) and the fold is counted.
//! Keys fixed by the config are always admitted (bounded by the config). Pending response
//! times keep one count per distinct millisecond value, at most [`PENDING_VALUES_MAX`] of them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::mapper::{Mapper, MetricType};
use super::names::{
    GrpcMethod, LimitStat, ServiceStat, Tags, domain_not_found_name, limit_stat_name,
};
use super::series::{Observations, Series};
use crate::metrics::names::{RATELIMIT_STATS_FOLDED_TOTAL, STATSD_DROPPED_LINES_TOTAL};
use crate::sync::lock;

/// Distinct pending response-time values (milliseconds) between two statsd flushes; an
/// observation of a new value past this is dropped and counted.
pub const PENDING_VALUES_MAX: usize = 4096;

/// Key of the fold of client-chosen names with no config name to fold into.
pub const OVERFLOW_KEY: &str = "_overflow";

/// One counter: its full name, its total, the part of it the statsd sink has sent, and the
/// Prometheus series it adds to (when the page is on).
pub(super) struct Counter {
    pub name: Box<str>,
    total: Total,
    sent: AtomicU64,
    pub series: Option<Arc<Series>>,
}

/// Where a counter's total is kept: its own, or a process-wide one (config loads, which every
/// config source counts in one place).
enum Total {
    Own(AtomicU64),
    Process(&'static AtomicU64),
}

impl Counter {
    fn new(tags: &Tags, mapper: Option<&Arc<Mapper>>, name: String, total: Total) -> Counter {
        let name = tags.apply(name);
        let series = mapper.map(|m| m.series(&name, MetricType::Counter));
        Counter {
            name: name.into_boxed_str(),
            total,
            sent: AtomicU64::new(0),
            series,
        }
    }

    fn add(&self, n: u64) {
        match &self.total {
            Total::Own(total) => total.fetch_add(n, Ordering::Relaxed),
            Total::Process(total) => total.fetch_add(n, Ordering::Relaxed),
        };
    }

    pub fn total(&self) -> u64 {
        match &self.total {
            Total::Own(total) => total.load(Ordering::Relaxed),
            Total::Process(total) => total.load(Ordering::Relaxed),
        }
    }

    /// The increase since the last call (gostats' `latch`).
    pub fn latch(&self) -> u64 {
        let total = self.total();
        total.wrapping_sub(self.sent.swap(total, Ordering::Relaxed))
    }
}

/// The six counters of a rate-limit key, each made at its first increase (a counter that
/// never rose is never sent, as gostats sends no zero increase).
pub(super) struct KeyCounters {
    /// The key the counters are named after (the one asked for, or its fold).
    key: Box<str>,
    stats: [OnceLock<Counter>; 6],
}

/// A method's response times: pending for the statsd sink, observed for the page.
struct Timer {
    name: Box<str>,
    pending: BTreeMap<u64, u64>,
    observed: Option<Observations>,
}

/// What the store was asked to serve.
pub(super) struct Sinks {
    /// Response times are kept for a statsd flush.
    pub statsd: bool,
    /// The Prometheus page's mapping, when the page is on.
    pub mapper: Option<Arc<Mapper>>,
}

pub(super) struct Store {
    tags: Tags,
    sinks: Sinks,
    max_keys: usize,
    keys: RwLock<HashMap<Box<str>, Arc<KeyCounters>>>,
    not_found: RwLock<HashMap<Box<str>, Arc<Counter>>>,
    /// Client-chosen keys admitted so far (detailed keys and unknown domains).
    client_keys: AtomicUsize,
    service: [Counter; 5],
    requests: [Counter; 2],
    timers: Mutex<[Timer; 2]>,
    folded: AtomicU64,
}

impl Store {
    /// `config_loads`: the process's config loads (success, error).
    pub fn new(
        tags: Tags,
        sinks: Sinks,
        max_keys: usize,
        config_loads: &'static [AtomicU64; 2],
    ) -> Store {
        let mapper = sinks.mapper.as_ref();
        let service = ServiceStat::ALL.map(|s| {
            let total = match s {
                ServiceStat::ConfigLoadSuccess => Total::Process(&config_loads[0]),
                ServiceStat::ConfigLoadError => Total::Process(&config_loads[1]),
                _ => Total::Own(AtomicU64::new(0)),
            };
            Counter::new(&tags, mapper, s.name().to_owned(), total)
        });
        let requests = GrpcMethod::ALL.map(|m| {
            Counter::new(
                &tags,
                mapper,
                m.total_requests(),
                Total::Own(AtomicU64::new(0)),
            )
        });
        let timers = GrpcMethod::ALL.map(|m| {
            let name = tags.apply(m.response_time());
            let observed =
                mapper.map(|mapper| Observations::new(mapper.series(&name, MetricType::Observer)));
            Timer {
                name: name.into_boxed_str(),
                pending: BTreeMap::new(),
                observed,
            }
        });
        Store {
            tags,
            sinks,
            max_keys,
            keys: RwLock::new(HashMap::new()),
            not_found: RwLock::new(HashMap::new()),
            client_keys: AtomicUsize::new(0),
            service,
            requests,
            timers: Mutex::new(timers),
            folded: AtomicU64::new(0),
        }
    }

    fn counter(&self, name: String) -> Counter {
        Counter::new(
            &self.tags,
            self.sinks.mapper.as_ref(),
            name,
            Total::Own(AtomicU64::new(0)),
        )
    }

    /// The counters of a rate-limit key. `fallback` names the key a client-chosen one folds
    /// into when the store is full (`None` when `key` is fixed by the config: always
    /// admitted); a fold is counted once per call.
    pub fn limit_key(&self, key: &str, fallback: Option<&str>) -> Arc<KeyCounters> {
        self.key_counters(key, fallback)
    }

    /// Adds `n` to `stat` of a key's counters.
    pub fn add_limit(&self, counters: &KeyCounters, stat: LimitStat, n: u64) {
        if n == 0 {
            return;
        }
        counters.stats[stat.index()]
            .get_or_init(|| self.counter(limit_stat_name(&counters.key, stat)))
            .add(n);
    }

    fn key_counters(&self, key: &str, fallback: Option<&str>) -> Arc<KeyCounters> {
        if let Some(c) = self.keys.read().unwrap_or_else(|p| p.into_inner()).get(key) {
            return Arc::clone(c);
        }
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = keys.get(key) {
            return Arc::clone(c);
        }
        let admitted = match fallback {
            None => key,
            Some(_) if self.admit_client_key() => key,
            Some(folded) => {
                self.count_fold();
                folded
            }
        };
        Arc::clone(keys.entry(admitted.into()).or_insert_with(|| {
            Arc::new(KeyCounters {
                key: admitted.into(),
                stats: Default::default(),
            })
        }))
    }

    fn count_fold(&self) {
        self.folded.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(RATELIMIT_STATS_FOLDED_TOTAL).increment(1);
    }

    /// Takes one of the client-chosen keys' places, if one is left.
    fn admit_client_key(&self) -> bool {
        self.client_keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// Adds 1 to `domain_not_found` of `domain` (sanitized), folded into `_overflow` when the
    /// store is full.
    pub fn add_domain_not_found(&self, domain: &str) {
        let read = self.not_found.read().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = read.get(domain) {
            c.add(1);
            return;
        }
        drop(read);
        let mut map = self.not_found.write().unwrap_or_else(|p| p.into_inner());
        let name = if map.contains_key(domain) || self.admit_client_key() {
            domain
        } else {
            self.count_fold();
            OVERFLOW_KEY
        };
        map.entry(name.into())
            .or_insert_with(|| Arc::new(self.counter(domain_not_found_name(name))))
            .add(1);
    }

    pub fn add_service(&self, stat: ServiceStat, n: u64) {
        self.service[stat.index()].add(n);
    }

    /// One intercepted gRPC call: `total_requests` and its response time in whole
    /// milliseconds (what envoyproxy/ratelimit's interceptor records).
    pub fn add_request(&self, method: GrpcMethod, millis: u64) {
        self.requests[method.index()].add(1);
        let mut timers = lock(&self.timers);
        let timer = &mut timers[method.index()];
        if let Some(observed) = &mut timer.observed {
            observed.observe(millis);
        }
        if self.sinks.statsd {
            let full = timer.pending.len() >= PENDING_VALUES_MAX;
            match timer.pending.get_mut(&millis) {
                Some(n) => *n += 1,
                None if full => {
                    metrics::counter!(STATSD_DROPPED_LINES_TOTAL).increment(1);
                }
                None => {
                    timer.pending.insert(millis, 1);
                }
            }
        }
    }

    /// Every counter made so far.
    pub fn for_each_counter(&self, mut f: impl FnMut(&Counter)) {
        self.service.iter().for_each(&mut f);
        self.requests.iter().for_each(&mut f);
        for c in self.keys.read().unwrap_or_else(|p| p.into_inner()).values() {
            c.stats.iter().filter_map(OnceLock::get).for_each(&mut f);
        }
        for c in self
            .not_found
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            f(c);
        }
    }

    /// The response times pending for statsd, by method name (taken: the next call returns
    /// only later ones).
    pub fn take_pending_times(&self) -> Vec<(Box<str>, BTreeMap<u64, u64>)> {
        let mut timers = lock(&self.timers);
        timers
            .iter_mut()
            .filter(|t| !t.pending.is_empty())
            .map(|t| (t.name.clone(), std::mem::take(&mut t.pending)))
            .collect()
    }

    /// The Prometheus observations of each method's response times.
    pub fn with_observations(&self, mut f: impl FnMut(&Observations)) {
        let timers = lock(&self.timers);
        timers
            .iter()
            .filter_map(|t| t.observed.as_ref())
            .for_each(&mut f);
    }

    /// Client-chosen names folded into another past the bound.
    pub fn folded(&self) -> u64 {
        self.folded.load(Ordering::Relaxed)
    }
}
