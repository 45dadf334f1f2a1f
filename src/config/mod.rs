//! The limits configuration: envoyproxy/ratelimit's YAML, loaded, validated and compiled into a
//! lookup tree of [`Rule`]s.
//!
//! Why its own layer: the file format is a compatibility promise (teams keep the ConfigMap they
//! wrote for envoyproxy/ratelimit), while the rest of sluice only needs "which rule governs these
//! descriptor entries". Everything here is pure: no I/O beyond reading the files, no clock.

use std::fmt;
use std::path::{Path, PathBuf};

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

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
