//! The limits configuration: envoyproxy/ratelimit's YAML, loaded, validated and compiled into a
//! lookup tree of [`Rule`]s.
//!
//! Why its own layer: the file format is a compatibility promise (teams keep the ConfigMap they
//! wrote for envoyproxy/ratelimit), while the rest of sluice only needs "which rule governs these
//! descriptor entries". Everything here is pure: no I/O beyond reading the files, no clock.
//!
//! Layout: `raw` deserializes the YAML with source lines, `xds` converts envoyproxy/ratelimit's
//! `RateLimitConfig` xDS resources into the same raw model (so both sources meet the same
//! rules and errors), `validate` checks and compiles it (collecting every error), `tree` holds
//! the compiled lookup tree and the matching, `error` the error types, `listing` the rule
//! listing of `/rlconfig`. [`Config`] ties them together.
//!
//! Compatibility notes (envoyproxy/ratelimit's `config_impl.go`): the accepted fields are its
//! `validKeys`, all of them honoured: `share_threshold` makes every value matching the wildcard
//! share one counter (an error on a value without `*`), `value_to_metric` names the rule's
//! metrics by the request's values like `detailed_metric`. Files naming the same domain are
//! merged with `LoadOptions::merge_domains` (`--merge-domain-config`, upstream's
//! `MERGE_DOMAIN_CONFIG`; a top-level descriptor repeated across them is still an error) and
//! rejected without it. Stricter than upstream on purpose: unknown fields are errors at every
//! level, and `unit`/`requests_per_unit` next to `unlimited: true` is an error (upstream ignores a
//! stray `requests_per_unit`).
//! Wildcards: upstream only treats a value ending in `*` as a prefix pattern; here `*` anywhere
//! in a value matches any run of characters, which agrees with upstream for every trailing-`*`
//! value.

mod bucket;
mod error;
mod limits;
mod listing;
mod locate;
mod raw;
mod stat_path;
mod tree;
mod validate;
mod xds;

pub use error::{ConfigError, ConfigErrors};
pub use limits::{ALIAS_RATIO_FROM, ConfigLimits};
pub use stat_path::{StatPath, StatSegment, StatValue, push_segment};
pub use tree::{
    HeaderFormat, HeaderPolicy, Limit, LimitAlgorithm, LimitSpec, Lookup, MatchKind,
    OverLimitSetting, Rule,
};

use crate::descriptor::Entry;
pub use bucket::BUCKET_SEARCH_STEPS;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use tree::Level;

/// One source of a domain's limits: a YAML file's text, or an xDS resource (converted by
/// `xds` as validation walks it; it has no lines).
enum Document<'a> {
    Yaml(&'a str),
    Xds(Box<xds::XdsDocument>),
}

/// A time unit as envoyproxy/ratelimit's YAML and Envoy's API name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Window length in milliseconds.
    pub const fn window_ms(self) -> u64 {
        const SECOND: u64 = 1_000;
        const DAY: u64 = 86_400 * SECOND;
        match self {
            Unit::Second => SECOND,
            Unit::Minute => 60 * SECOND,
            Unit::Hour => 3_600 * SECOND,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// Parses a unit name, case-insensitively (`second`, `MINUTE`, `Hour`, ...).
    pub fn parse(name: &str) -> Option<Unit> {
        const NAMES: [(&str, Unit); 7] = [
            ("second", Unit::Second),
            ("minute", Unit::Minute),
            ("hour", Unit::Hour),
            ("day", Unit::Day),
            ("week", Unit::Week),
            ("month", Unit::Month),
            ("year", Unit::Year),
        ];
        NAMES
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, unit)| *unit)
    }

    /// The unit that best names a custom window, for Envoy's reply (which can only name a
    /// unit): the one nearest by ratio, a tie going to the longer unit. Exact when the window is
    /// a unit; the exact window is in the `RateLimit-Policy` header and `duration_until_reset`.
    pub fn nearest(window_ms: u64) -> Unit {
        const ALL: [Unit; 7] = [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
            Unit::Year,
        ];
        let w = u128::from(window_ms);
        let mut best = Unit::Second;
        for pair in ALL.windows(2) {
            let (short, long) = (
                u128::from(pair[0].window_ms()),
                u128::from(pair[1].window_ms()),
            );
            // Past the geometric mean of two neighbours the longer one is nearer.
            if w * w >= short * long {
                best = pair[1];
            }
        }
        best
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

/// Parses a window or quantum length: a positive integer and a suffix `ms`, `s`, `m`, `h` or
/// `d` (`1500ms`, `30s`, `5m`). `None` when malformed or zero.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let scale = match suffix {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(scale).filter(|&ms| ms > 0)
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Rule name of problems with a config source itself (unreadable path, empty directory).
const SOURCE_RULE: &str = "config";

/// One domain's compiled descriptors.
#[derive(Debug, Clone)]
struct Domain {
    name: String,
    root: Level,
    /// The domain-level `response_headers` (what a limit override with no rule uses).
    headers: HeaderPolicy,
}

/// The loaded limits: every domain's lookup tree. Immutable once built; `Send + Sync`, meant to
/// be shared in an `Arc` and swapped whole on reload.
#[derive(Debug, Clone)]
pub struct Config {
    /// In load order (files sorted by name).
    domains: Vec<Domain>,
    by_name: HashMap<String, usize>,
    sources: Vec<PathBuf>,
    rule_count: usize,
}

impl Config {
    /// Loads a single YAML file, or every `*.yaml` / `*.yml` file directly in a directory
    /// (sorted by name, not recursive, entries starting with `.` skipped, symlinks followed).
    /// One domain per file; a domain defined twice is an error naming both files.
    ///
    /// Returns every problem found in every file, not only the first.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_with(path, LoadOptions::default())
    }

    /// [`Config::load`] with options (merging one domain across files).
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Config, ConfigErrors> {
        let meta = std::fs::metadata(path).map_err(|e| {
            ConfigErrors(vec![ConfigError::new(
                path,
                None,
                SOURCE_RULE,
                format!("cannot read config path: {e}"),
            )])
        })?;
        let files = if meta.is_dir() {
            let files = yaml_files_in(path)?;
            if files.is_empty() {
                return Err(ConfigErrors(vec![ConfigError::new(
                    path,
                    None,
                    SOURCE_RULE,
                    format!("no *.yaml files in {}", path.display()),
                )]));
            }
            files
        } else {
            vec![path.to_path_buf()]
        };

        let mut errors = Vec::new();
        let mut sources = Vec::with_capacity(files.len());
        let limit = options.limits.max_bytes;
        let mut budget = limit;
        for file in files {
            match read_config_file(&file, &mut budget, limit) {
                Ok(bytes) => match String::from_utf8(bytes) {
                    Ok(text) => sources.push((file, text)),
                    Err(e) => errors.push(ConfigError::new(
                        &file,
                        None,
                        SOURCE_RULE,
                        format!("file is not valid UTF-8: {}", e.utf8_error()),
                    )),
                },
                Err(message) => errors.push(ConfigError::new(&file, None, SOURCE_RULE, message)),
            }
        }
        Self::build(
            sources
                .iter()
                .map(|(f, t)| (f.clone(), Document::Yaml(t.as_str()))),
            errors,
            options,
        )
    }

    /// Compiles one file's text (one domain). `file` only names the source in errors.
    pub fn from_yaml_str(file: &Path, text: &str) -> Result<Config, ConfigErrors> {
        Self::build(
            std::iter::once((file.to_path_buf(), Document::Yaml(text))),
            Vec::new(),
            LoadOptions::default(),
        )
    }

    /// Compiles documents, each named by its source (a file, or an xDS resource), with the
    /// same rules whatever their origin.
    fn build<'a>(
        sources: impl Iterator<Item = (PathBuf, Document<'a>)>,
        mut errors: Vec<ConfigError>,
        options: LoadOptions,
    ) -> Result<Config, ConfigErrors> {
        let mut domains: Vec<Domain> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        // domain -> file that defined it first
        let mut defined_in: HashMap<String, PathBuf> = HashMap::new();
        let mut paths = Vec::new();
        for (file, document) in sources {
            let file = file.as_path();
            paths.push(file.to_path_buf());
            let before = errors.len();
            let compiled = match document {
                Document::Yaml(text) => validate::compile_yaml(
                    file,
                    text,
                    options.default_headers,
                    &options.limits,
                    &mut errors,
                ),
                Document::Xds(resource) => {
                    let (root, descriptors) = resource.into_parts();
                    let headers = options.default_headers;
                    validate::compile_raw(file, root, descriptors, headers, &mut errors)
                }
            };
            let Some((name, line)) = compiled.domain else {
                continue;
            };
            if let (true, Some(first), Some(&index)) = (
                options.merge_domains,
                defined_in.get(&name),
                by_name.get(&name),
            ) {
                if errors.len() == before {
                    for path in domains[index].root.merge(compiled.root) {
                        errors.push(ConfigError::new(
                            file,
                            line,
                            &path,
                            format!(
                                "descriptor `{path}` of domain `{name}` is also defined in {}; \
                                 merged domains must not repeat a top-level descriptor",
                                first.display()
                            ),
                        ));
                    }
                }
                continue;
            }
            if let Some(first) = defined_in.get(&name) {
                errors.push(ConfigError::new(
                    file,
                    line,
                    error::DOMAIN_RULE,
                    format!(
                        "duplicate domain `{name}`: already defined in {}",
                        first.display()
                    ),
                ));
                continue;
            }
            defined_in.insert(name.clone(), file.to_path_buf());
            if errors.len() == before {
                by_name.insert(name.clone(), domains.len());
                domains.push(Domain {
                    name,
                    root: compiled.root,
                    headers: compiled.headers,
                });
            }
        }
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        let rule_count = domains.iter().map(|d| d.root.rule_count()).sum();
        Ok(Config {
            domains,
            by_name,
            sources: paths,
            rule_count,
        })
    }

    /// No domain at all: what an engine holds before its first config arrives.
    pub fn empty() -> Config {
        Config {
            domains: Vec::new(),
            by_name: HashMap::new(),
            sources: Vec::new(),
            rule_count: 0,
        }
    }

    pub fn has_domain(&self, domain: &str) -> bool {
        self.by_name.contains_key(domain)
    }

    /// Finds the rule governing a request descriptor, as envoyproxy/ratelimit's `GetLimit`
    /// does: entry by entry from the domain's top level, each entry matched exactly, else by
    /// the first wildcard value (config order), else by a key-only descriptor. The node matched
    /// at the last entry is the answer; a limit on an earlier entry does not apply.
    pub fn lookup(&self, domain: &str, entries: &[Entry]) -> Lookup<'_> {
        let Some(domain) = self.by_name.get(domain).and_then(|&i| self.domains.get(i)) else {
            return Lookup::UnknownDomain;
        };
        let mut level = &domain.root;
        let last = entries.len().saturating_sub(1);
        for (i, entry) in entries.iter().enumerate() {
            let Some((node, kind)) = level.find(&entry.key, &entry.value) else {
                return Lookup::NoRule;
            };
            if i == last {
                return Lookup::Rule {
                    rule: &node.rule,
                    kind,
                };
            }
            if node.children.is_empty() {
                return Lookup::NoRule;
            }
            level = &node.children;
        }
        Lookup::NoRule
    }

    /// [`Config::lookup`] with its reasons, for `sluice explain`: which node each entry matched
    /// and why the walk ended where it did. Allocates; never on the request path.
    pub fn trace(&self, domain: &str, entries: &[Entry]) -> Trace<'_> {
        let Some(domain) = self.by_name.get(domain).and_then(|&i| self.domains.get(i)) else {
            return Trace {
                steps: Vec::new(),
                end: TraceEnd::UnknownDomain,
            };
        };
        let mut steps = Vec::new();
        let mut level = &domain.root;
        let last = entries.len().saturating_sub(1);
        for (i, entry) in entries.iter().enumerate() {
            let Some((node, kind)) = level.find(&entry.key, &entry.value) else {
                return Trace {
                    steps,
                    end: TraceEnd::NoMatch { entry: i },
                };
            };
            steps.push((&node.rule, kind));
            if i == last {
                return Trace {
                    steps,
                    end: TraceEnd::Matched {
                        nested: !node.children.is_empty(),
                    },
                };
            }
            if node.children.is_empty() {
                return Trace {
                    steps,
                    end: TraceEnd::DeeperThanConfig { entry: i + 1 },
                };
            }
            level = &node.children;
        }
        Trace {
            steps,
            end: TraceEnd::NoMatch { entry: 0 },
        }
    }

    /// The domain-level response-header policy; the default (none) for unknown domains.
    pub fn domain_headers(&self, domain: &str) -> HeaderPolicy {
        self.by_name
            .get(domain)
            .and_then(|&i| self.domains.get(i))
            .map_or_else(HeaderPolicy::default, |d| d.headers)
    }

    /// Domain names, in load order.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.iter().map(|d| d.name.as_str())
    }

    /// Number of descriptors with a `rate_limit`, over all domains.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }

    /// The files this config was loaded from, in load order.
    pub fn sources(&self) -> &[PathBuf] {
        &self.sources
    }
}

/// How files are combined into one config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files naming the same domain are merged (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`)
    /// instead of being an error; a top-level descriptor defined in two of them still is.
    pub merge_domains: bool,
    /// Response headers of domains that set no `response_headers` (`--response-headers`,
    /// envoyproxy/ratelimit's `LIMIT_RESPONSE_HEADERS_ENABLED`).
    pub default_headers: HeaderPolicy,
    /// What the files may cost to read: bytes, YAML nodes, nesting, aliases.
    pub limits: ConfigLimits,
}

/// Reads the regular file at `path` within the byte budget `budget`, taking its size from it
/// ([`crate::file`]): a FIFO, a device or a file past `--max-config-bytes` (`limit`, all of
/// the config's files together) is an error, at once.
pub fn read_config_file(path: &Path, budget: &mut u64, limit: u64) -> Result<Vec<u8>, String> {
    let bytes = crate::file::read_regular(path, *budget).map_err(|e| match e {
        crate::file::ReadError::TooLarge(_) => format!(
            "the config is larger than --max-config-bytes {limit} (all of its files together)"
        ),
        other => other.to_string(),
    })?;
    *budget -= bytes.len() as u64;
    Ok(bytes)
}

/// How [`Config::trace`] walked a descriptor: the rule matched at each entry, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace<'a> {
    pub steps: Vec<(&'a Rule, MatchKind)>,
    pub end: TraceEnd,
}

/// Why a [`Trace`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceEnd {
    UnknownDomain,
    /// Entry `entry` matched no descriptor at its level.
    NoMatch {
        entry: usize,
    },
    /// The node matched at `entry - 1` has no nested descriptors, so entry `entry` and any
    /// later ones are deeper than the config.
    DeeperThanConfig {
        entry: usize,
    },
    /// Every entry matched; the last step's rule governs the descriptor. `nested`: that node
    /// has nested descriptors of its own (so, without a limit, it is not a whitelist entry).
    Matched {
        nested: bool,
    },
}

/// The `*.yaml` / `*.yml` regular files (symlinks followed) directly in `dir`, sorted by name,
/// skipping names that start with `.` (Kubernetes ConfigMap mounts keep `..data` and
/// `..2024_...` entries next to the visible symlinks).
fn yaml_files_in(dir: &Path) -> Result<Vec<PathBuf>, ConfigErrors> {
    let read_error = |e: std::io::Error| {
        ConfigErrors(vec![ConfigError::new(
            dir,
            None,
            SOURCE_RULE,
            format!("cannot list directory: {e}"),
        )])
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let entry = entry.map_err(read_error)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let is_yaml = Path::new(&*name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml");
        if !is_yaml {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks; a dangling link or a directory named `x.yaml` is skipped.
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests;
