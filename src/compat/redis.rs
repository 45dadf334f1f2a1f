//! envoyproxy/ratelimit's backend variables: the Redis ones become sluice's Redis settings, and
//! every backend setting sluice cannot honour as written stops `serve` instead of being ignored.
//!
//! Why refuse rather than warn: a backend setting that is given but not applied changes where
//! the counters live. A Sentinel URL that was logged once as ignored, with the embedded memory
//! backend serving instead, made each of N replicas admit the whole limit, and nothing failed.
//! So only the absence of every backend variable selects the memory backend; a variable that
//! names a backend sluice does not have (memcache), a Redis variable without `REDIS_URL`, or a
//! value sluice cannot apply as written is an error naming the variable.

use super::{Translation, map_var, truthy};

/// The Redis variables that mean nothing without `REDIS_URL` (envoyproxy/ratelimit's
/// settings.go), `REDIS_URL` itself excepted.
const REDIS_VARIABLES: &[&str] = &[
    "REDIS_AUTH",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_SIZE",
    "REDIS_SENTINEL_AUTH",
    "REDIS_SOCKET_TYPE",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_TIMEOUT",
    "REDIS_TLS",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_TYPE",
];

/// Variables of the memcache backend, which sluice does not have.
const MEMCACHE_VARIABLES: &[&str] = &[
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
];

/// Redis client tuning of envoyproxy/ratelimit's Go client, with what sluice does instead.
/// Harmless to leave set: reported, not applied.
const TUNING: &[(&str, &str)] = &[
    (
        "REDIS_PIPELINE_WINDOW",
        "concurrent decisions are batched without waiting for a batch to fill",
    ),
    (
        "REDIS_TIMEOUT",
        "each decision has its own deadline (--backend-timeout-ms)",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed; calls beyond --backend-max-in-flight fail fast",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "sluice starts without Redis and reports not ready until it answers",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "sluice starts without Redis and reports not ready until it answers",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "sluice starts without Redis and reports not ready until it answers",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "a request's slot groups are always sent in parallel",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "always on for /readyz and gRPC health (a Redis PING every second); /healthcheck \
         ignores the backend, since Envoy Gateway probes liveness there",
    ),
];

/// What the sluice URL's scheme must be for `REDIS_TYPE`.
const SCHEMES: &[(&str, &[&str])] = &[
    (
        "single",
        &["redis", "rediss", "redis+unix", "unix", "valkey", "valkeys"],
    ),
    ("cluster", &["redis+cluster", "rediss+cluster"]),
    ("sentinel", &["redis+sentinel", "rediss+sentinel"]),
];

/// A variable's value, `None` when unset or blank (templates often render empty secrets).
type Value<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Translates the backend variables into `out` (settings, notes, and the errors that stop
/// `serve`).
pub(super) fn translate(get: &dyn Fn(&str) -> Option<String>, out: &mut Translation) {
    let value = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let Some(url) = redis_url(&value, out) else {
        return;
    };
    let errors_before = out.errors.len();
    let tls = tls(&value, &url, out);
    let kind = value("REDIS_TYPE").map(|k| k.trim().to_ascii_lowercase());
    if let Some(kind) = kind
        .as_deref()
        .filter(|k| !SCHEMES.iter().any(|(n, _)| n == k))
    {
        out.errors.push(format!(
            "REDIS_TYPE={kind} is not supported (single, cluster or sentinel)"
        ));
    }
    // `user:password` or a bare password, as envoyproxy/ratelimit reads REDIS_AUTH; the user
    // goes into the URL, the password into SLUICE_REDIS_PASSWORD (never logged).
    let (user, password) = split_auth(value("REDIS_AUTH"));
    let translated = sluice_url(&url, kind.as_deref(), tls, user.as_deref(), &value, out);
    if out.errors.len() > errors_before {
        return;
    }
    if let Some(url) = translated {
        map_var(get, "REDIS_URL", "SLUICE_REDIS_URL", url, out);
    }
    if let Some(password) = password {
        map_var(get, "REDIS_AUTH", "SLUICE_REDIS_PASSWORD", password, out);
    }
    sentinel_auth(get, &value, kind.as_deref(), out);
    files_and_pool(get, &value, out);
    tuning_notes(&value, out);
}

/// `REDIS_URL`, or `None` when it is not set: then the memory backend serves, unless another
/// backend variable was given (an error). A backend sluice does not have is an error either way.
fn redis_url(value: Value<'_>, out: &mut Translation) -> Option<String> {
    let backend = value("BACKEND_TYPE");
    if let Some(kind) = backend
        .as_deref()
        .filter(|b| !b.trim().eq_ignore_ascii_case("redis"))
    {
        out.errors.push(format!(
            "BACKEND_TYPE={kind} is not supported: sluice keeps its windows in Redis (REDIS_URL) \
             or, when no backend variable is set at all, in process (one instance only)"
        ));
    }
    for name in MEMCACHE_VARIABLES.iter().filter(|n| value(n).is_some()) {
        out.errors.push(format!(
            "{name} is set: memcache is not supported (Redis only, see REDIS_URL)"
        ));
    }
    let url = value("REDIS_URL");
    if url.is_none() {
        let mut given: Vec<&str> = REDIS_VARIABLES
            .iter()
            .copied()
            .filter(|n| value(n).is_some())
            .collect();
        if backend.is_some_and(|b| b.trim().eq_ignore_ascii_case("redis")) {
            given.insert(0, "BACKEND_TYPE");
        }
        if !given.is_empty() {
            out.errors.push(format!(
                "{} set but REDIS_URL is not: sluice does not assume envoyproxy/ratelimit's \
                 default REDIS_URL (/var/run/nutcracker/ratelimit.sock); set REDIS_URL, or unset \
                 {} to serve from the embedded memory backend (one instance only)",
                given.join(", "),
                if given.len() == 1 { "it" } else { "them" },
            ));
        }
    }
    url
}

/// `REDIS_TLS`, with what its files and hostname verification ask checked against it.
fn tls(value: Value<'_>, url: &str, out: &mut Translation) -> bool {
    let flag = |name: &str, out: &mut Translation| -> bool {
        let Some(raw) = value(name) else {
            return false;
        };
        truthy(&raw).unwrap_or_else(|| {
            out.errors
                .push(format!("{name}={raw:?}: expected true or false"));
            false
        })
    };
    let tls = flag("REDIS_TLS", out);
    if flag("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", out) {
        out.errors.push(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true is not supported: sluice always verifies \
             that the Redis certificate names the host it connects to; give the CA that signs it \
             (REDIS_TLS_CACERT) and a host name the certificate carries"
                .into(),
        );
    }
    for name in [
        "REDIS_TLS_CACERT",
        "REDIS_TLS_CLIENT_CERT",
        "REDIS_TLS_CLIENT_KEY",
    ] {
        if !tls && value(name).is_some() && !url.starts_with("rediss") {
            out.errors.push(format!(
                "{name} is set but REDIS_TLS is not true: the certificate would not be used"
            ));
        }
    }
    match (
        value("REDIS_TLS_CLIENT_CERT"),
        value("REDIS_TLS_CLIENT_KEY"),
    ) {
        (Some(_), None) => out
            .errors
            .push("REDIS_TLS_CLIENT_CERT is set without REDIS_TLS_CLIENT_KEY".into()),
        (None, Some(_)) => out
            .errors
            .push("REDIS_TLS_CLIENT_KEY is set without REDIS_TLS_CLIENT_CERT".into()),
        _ => {}
    }
    tls
}

/// `REDIS_SENTINEL_AUTH` (`user:password` or a password) for a Sentinel `REDIS_TYPE`.
fn sentinel_auth(
    get: &dyn Fn(&str) -> Option<String>,
    value: Value<'_>,
    kind: Option<&str>,
    out: &mut Translation,
) {
    let (user, password) = split_auth(value("REDIS_SENTINEL_AUTH"));
    if kind == Some("sentinel") {
        if let Some(user) = user {
            let to = "SLUICE_REDIS_SENTINEL_USER";
            map_var(get, "REDIS_SENTINEL_AUTH", to, user, out);
        }
        if let Some(password) = password {
            let to = "SLUICE_REDIS_SENTINEL_PASSWORD";
            map_var(get, "REDIS_SENTINEL_AUTH", to, password, out);
        }
    } else if password.is_some() {
        out.notes
            .push("REDIS_SENTINEL_AUTH ignored: REDIS_TYPE is not sentinel".into());
    }
}

/// The TLS files, the pool size and an explicit pipeline limit.
fn files_and_pool(get: &dyn Fn(&str) -> Option<String>, value: Value<'_>, out: &mut Translation) {
    for (legacy, sluice) in [
        ("REDIS_TLS_CACERT", "SLUICE_REDIS_CA_FILE"),
        ("REDIS_TLS_CLIENT_CERT", "SLUICE_REDIS_TLS_CERT"),
        ("REDIS_TLS_CLIENT_KEY", "SLUICE_REDIS_TLS_KEY"),
        ("REDIS_POOL_SIZE", "SLUICE_REDIS_POOL_SIZE"),
    ] {
        if let Some(v) = value(legacy) {
            map_var(get, legacy, sluice, v, out);
        }
    }
    // Its 0 (the default) means "no implicit pipelining" there; sluice's batching adds no wait,
    // so only an explicit limit is carried over.
    if let Some(limit) = value("REDIS_PIPELINE_LIMIT").filter(|l| l.trim() != "0") {
        let to = "SLUICE_REDIS_BATCH_MAX";
        map_var(get, "REDIS_PIPELINE_LIMIT", to, limit, out);
    }
}

/// The Go client's tuning and the per-second Redis: reported, not applied.
fn tuning_notes(value: Value<'_>, out: &mut Translation) {
    if value("REDIS_PERSECOND").is_some_and(|v| truthy(&v) == Some(true)) {
        out.notes.push(
            "REDIS_PERSECOND: per-second limits are kept in the Redis of REDIS_URL with every \
             other window (sluice uses one Redis); REDIS_PERSECOND_* are not used"
                .into(),
        );
    }
    for (name, why) in TUNING.iter().filter(|(n, _)| value(n).is_some()) {
        out.notes.push(format!("{name} is not supported: {why}"));
    }
}

/// `user:password` -> (user, password); `password` -> (None, password).
fn split_auth(auth: Option<String>) -> (Option<String>, Option<String>) {
    match auth.as_deref().map(|a| a.split_once(':')) {
        Some(Some((user, password))) => (Some(user.to_owned()), Some(password.to_owned())),
        Some(None) => (None, auth),
        None => (None, None),
    }
}

/// The sluice URL for envoyproxy/ratelimit's `REDIS_URL` of type `kind` (None: single), or
/// `None` with an error in `out`.
fn sluice_url(
    url: &str,
    kind: Option<&str>,
    tls: bool,
    user: Option<&str>,
    value: &dyn Fn(&str) -> Option<String>,
    out: &mut Translation,
) -> Option<String> {
    let mut refuse = |why: String| {
        out.errors.push(why);
        None
    };
    if let Some((scheme, _)) = url.split_once("://") {
        // Already one of sluice's forms: its scheme says the topology, and must agree with
        // REDIS_TYPE and REDIS_TLS when they are given.
        let expected = kind.and_then(|k| SCHEMES.iter().find(|(n, _)| *n == k));
        if let Some((kind, schemes)) = expected.filter(|(_, s)| !s.contains(&scheme)) {
            return refuse(format!(
                "REDIS_TYPE={kind} but REDIS_URL is a {scheme}:// URL (expected {})",
                schemes.join("://, ") + "://"
            ));
        }
        if tls && !scheme.starts_with("rediss") && !scheme.starts_with("valkeys") {
            return refuse(format!(
                "REDIS_TLS=true but REDIS_URL is a {scheme}:// URL (write rediss...)"
            ));
        }
        return Some(url.to_owned());
    }
    let s = if tls { "s" } else { "" };
    let userinfo = user.map_or(String::new(), |u| format!("{u}@"));
    match kind.unwrap_or("single") {
        "cluster" => Some(format!("redis{s}+cluster://{userinfo}{url}")),
        "sentinel" => {
            let Some((master, sentinels)) = url.split_once(',').filter(|(m, h)| {
                !m.trim().is_empty() && h.split(',').any(|h| !h.trim().is_empty())
            }) else {
                return refuse(format!(
                    "REDIS_TYPE=sentinel expects REDIS_URL=master-name,host1:port1[,host2:port2...] \
                     (the master name, then the sentinels), not {url:?}"
                ));
            };
            Some(format!(
                "redis{s}+sentinel://{userinfo}{sentinels}/{master}"
            ))
        }
        _ if url.starts_with('/')
            || value("REDIS_SOCKET_TYPE").is_some_and(|t| t.eq_ignore_ascii_case("unix")) =>
        {
            if tls {
                return refuse("REDIS_TLS=true but REDIS_URL is a unix socket".into());
            }
            let query = user.map_or(String::new(), |u| format!("?user={u}"));
            Some(format!("redis+unix://{url}{query}"))
        }
        _ => Some(format!("redis{s}://{userinfo}{url}")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;

    #[test]
    fn cluster_sentinel_tls_auth_and_unix_sockets() {
        let t = run(&[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", "h1:7000,h2:7001"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "app:s3cret"),
        ]);
        assert_eq!(
            t.set["SLUICE_REDIS_URL"],
            "rediss+cluster://app@h1:7000,h2:7001"
        );
        assert_eq!(t.set["SLUICE_REDIS_PASSWORD"], "s3cret");
        let t = run(&[
            ("REDIS_URL", "/var/run/redis.sock"),
            ("REDIS_AUTH", "app:pw"),
        ]);
        assert_eq!(
            t.set["SLUICE_REDIS_URL"],
            "redis+unix:///var/run/redis.sock?user=app"
        );
        assert_eq!(t.set["SLUICE_REDIS_PASSWORD"], "pw");
        let t = run(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26380"),
            ("REDIS_AUTH", "primary-pw"),
            ("REDIS_SENTINEL_AUTH", "watcher:sentinel-pw"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/tls/ca.crt"),
            ("REDIS_TLS_CLIENT_CERT", "/tls/client.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/tls/client.key"),
        ]);
        assert!(t.errors.is_empty(), "{t:#?}");
        let expect = [
            (
                "SLUICE_REDIS_URL",
                "rediss+sentinel://s1:26379,s2:26380/mymaster",
            ),
            ("SLUICE_REDIS_PASSWORD", "primary-pw"),
            ("SLUICE_REDIS_SENTINEL_USER", "watcher"),
            ("SLUICE_REDIS_SENTINEL_PASSWORD", "sentinel-pw"),
            ("SLUICE_REDIS_CA_FILE", "/tls/ca.crt"),
            ("SLUICE_REDIS_TLS_CERT", "/tls/client.crt"),
            ("SLUICE_REDIS_TLS_KEY", "/tls/client.key"),
        ];
        for (k, v) in expect {
            assert_eq!(t.set.get(k).map(String::as_str), Some(v), "{k}: {t:#?}");
        }
        assert_eq!(t.set.len(), expect.len(), "{t:#?}");
    }

    /// Each backend setting sluice cannot honour is an error naming it, never a note.
    #[test]
    fn backend_settings_that_cannot_be_honoured_are_errors() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("BACKEND_TYPE", "memcache")],
                "BACKEND_TYPE=memcache is not supported",
            ),
            (
                &[("MEMCACHE_HOST_PORT", "m:11211")],
                "MEMCACHE_HOST_PORT is set",
            ),
            (
                &[("BACKEND_TYPE", "redis")],
                "BACKEND_TYPE set but REDIS_URL is not",
            ),
            (
                &[("REDIS_AUTH", "pw"), ("REDIS_POOL_SIZE", "4")],
                "REDIS_AUTH, REDIS_POOL_SIZE set but REDIS_URL is not",
            ),
            (
                &[("REDIS_TYPE", "sentinel")],
                "REDIS_TYPE set but REDIS_URL is not",
            ),
            (
                &[("REDIS_TYPE", "replicated"), ("REDIS_URL", "h:1")],
                "REDIS_TYPE=replicated is not supported (single, cluster or sentinel)",
            ),
            (
                &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "h:26379")],
                "REDIS_TYPE=sentinel expects REDIS_URL=master-name,host1:port1",
            ),
            (
                &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "redis://h:6379")],
                "REDIS_TYPE=sentinel but REDIS_URL is a redis:// URL",
            ),
            (
                &[("REDIS_TLS", "true"), ("REDIS_URL", "redis://h:6379")],
                "REDIS_TLS=true but REDIS_URL is a redis:// URL",
            ),
            (
                &[("REDIS_TLS", "yes please"), ("REDIS_URL", "h:6379")],
                "REDIS_TLS=\"yes please\": expected true or false",
            ),
            (
                &[("REDIS_URL", "h:6379"), ("REDIS_TLS_CACERT", "/ca.crt")],
                "REDIS_TLS_CACERT is set but REDIS_TLS is not true",
            ),
            (
                &[
                    ("REDIS_URL", "h:6379"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_CLIENT_CERT", "/c.crt"),
                ],
                "REDIS_TLS_CLIENT_CERT is set without REDIS_TLS_CLIENT_KEY",
            ),
            (
                &[
                    ("REDIS_URL", "h:6379"),
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
                ],
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true is not supported",
            ),
        ];
        for (vars, error) in cases {
            let t = run(vars);
            assert!(
                t.errors.iter().any(|e| e.contains(error)),
                "{vars:?}: expected {error:?} in {t:#?}"
            );
            assert!(!t.set.contains_key("SLUICE_REDIS_URL"), "{vars:?}: {t:#?}");
        }
        // Empty values count as unset (templates often render empty secrets); no backend
        // variable at all is the memory backend, with nothing to say.
        let t = run(&[("REDIS_AUTH", ""), ("REDIS_URL", "")]);
        assert_eq!(t, Default::default());
        // Harmless leftovers are reported, not refused.
        let t = run(&[
            ("BACKEND_TYPE", "redis"),
            ("REDIS_URL", "h:6379"),
            ("REDIS_TIMEOUT", "10s"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "p:6379"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false"),
        ]);
        assert!(t.errors.is_empty(), "{t:#?}");
        assert_eq!(t.set["SLUICE_REDIS_URL"], "redis://h:6379");
        assert!(
            t.notes
                .iter()
                .any(|n| n.starts_with("REDIS_TIMEOUT is not supported"))
        );
        assert!(
            t.notes
                .iter()
                .any(|n| n.starts_with("REDIS_PERSECOND: per-second"))
        );
    }
}
