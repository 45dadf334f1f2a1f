//! The flags of envoyproxy/ratelimit's stats in `sluice serve` (each also read from a
//! `SLUICE_*` variable, which its `USE_STATSD`, `STATSD_*`, `EXTRA_TAGS`, `USE_PROMETHEUS` and
//! `PROMETHEUS_*` fill in: see `compat`), flattened into the command's flags by `main`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Mapper, Protocol, StatsdSettings, Tags, UpstreamSettings};

#[derive(Debug, Clone, clap::Args)]
pub struct StatsArgs {
    /// Send envoyproxy/ratelimit's stats, under its names, to the statsd daemon at HOST:PORT
    /// (its USE_STATSD, STATSD_HOST, STATSD_PORT).
    #[arg(long, env = "SLUICE_STATSD_ADDR", value_name = "HOST:PORT")]
    pub statsd_addr: Option<String>,
    /// The statsd transport: tcp (gostats', envoyproxy/ratelimit's) or udp.
    #[arg(
        long,
        env = "SLUICE_STATSD_PROTOCOL",
        value_enum,
        default_value = "tcp"
    )]
    pub statsd_protocol: StatsdProtocol,
    /// Milliseconds between two statsd flushes of the counters (STATS_FLUSH_INTERVAL).
    #[arg(long, env = "SLUICE_STATS_FLUSH_INTERVAL_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub stats_flush_interval_ms: u64,
    /// Tags appended to every envoyproxy/ratelimit stat name, KEY:VALUE,... (EXTRA_TAGS).
    #[arg(long, env = "SLUICE_STATS_TAGS", value_name = "TAGS")]
    pub stats_tags: Option<String>,
    /// Also serve envoyproxy/ratelimit's stats on --metrics-addr, named as its Prometheus sink
    /// names them (USE_PROMETHEUS).
    #[arg(
        long,
        env = "SLUICE_METRICS_RATELIMIT_NAMES",
        requires = "metrics_addr"
    )]
    pub metrics_ratelimit_names: bool,
    /// statsd_exporter mapping file naming those series instead of envoyproxy/ratelimit's
    /// default mapping (PROMETHEUS_MAPPER_YAML); implies --metrics-ratelimit-names.
    #[arg(
        long,
        env = "SLUICE_METRICS_MAPPER",
        value_name = "FILE",
        requires = "metrics_addr"
    )]
    pub metrics_mapper: Option<PathBuf>,
    /// With the default mapping, response times in milliseconds, not seconds
    /// (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
    #[arg(long, env = "SLUICE_METRICS_RESPONSE_TIME_MS")]
    pub metrics_response_time_ms: bool,
    /// Path of the metrics page on --metrics-addr (PROMETHEUS_PATH).
    #[arg(long, env = "SLUICE_METRICS_PATH", default_value = "/metrics")]
    pub metrics_path: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StatsdProtocol {
    Tcp,
    Udp,
}

impl StatsArgs {
    /// The settings these flags describe; an error names the flag (and for a mapping file,
    /// the file and line).
    pub fn settings(&self) -> Result<UpstreamSettings, String> {
        let tags = Tags::parse(self.stats_tags.as_deref().unwrap_or_default())
            .map_err(|e| format!("--stats-tags: {e}"))?;
        let statsd = match &self.statsd_addr {
            None => None,
            Some(addr) => {
                let port = addr.rsplit_once(':').map(|(_, p)| p.parse::<u16>());
                if !matches!(port, Some(Ok(_))) {
                    return Err(format!("--statsd-addr {addr:?}: expected HOST:PORT"));
                }
                Some(StatsdSettings {
                    addr: addr.clone(),
                    protocol: match self.statsd_protocol {
                        StatsdProtocol::Tcp => Protocol::Tcp,
                        StatsdProtocol::Udp => Protocol::Udp,
                    },
                    flush_interval: Duration::from_millis(self.stats_flush_interval_ms),
                })
            }
        };
        if !self.metrics_path.starts_with('/') {
            return Err(format!(
                "--metrics-path {:?}: a path starts with /",
                self.metrics_path
            ));
        }
        let prometheus = match &self.metrics_mapper {
            Some(file) => {
                Some(Mapper::from_file(file).map_err(|e| format!("--metrics-mapper {e}"))?)
            }
            None if self.metrics_ratelimit_names => Some(
                Mapper::default_mapping(self.metrics_response_time_ms)
                    .map_err(|e| format!("the default mapping: {e}"))?,
            ),
            None => None,
        };
        Ok(UpstreamSettings {
            tags,
            statsd,
            prometheus: prometheus.map(Arc::new),
            max_keys: super::STAT_KEYS_MAX,
        })
    }
}
