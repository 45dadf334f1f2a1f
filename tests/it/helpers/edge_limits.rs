//! What `deploy/base/limits` promises a client of the Envoy configs `deploy/` ships (the
//! bootstrap and both Istio EnvoyFilters send its descriptors), as a client sees it through a
//! real Envoy: which request of a client is refused, and the headers README describes
//! (`RateLimit-Policy`/`RateLimit`, `Retry-After`, `x-envoy-ratelimited`; Envoy's own
//! `X-RateLimit-*` where a config turns them on). Clients are told apart by their loopback
//! source address (`127.0.0.x`), which Envoy's `remote_address` action reports.

use std::net::SocketAddr;
use std::time::Instant;

use super::http::{HttpResponse, Req};

/// `t` of a `RateLimit` header or a `Retry-After`: whole seconds until the first hit of a
/// `window`-second limit leaves it, `window` right after that hit. `since_first` started just
/// before it was sent.
pub fn assert_countdown(what: &str, got: u64, window: u64, since_first: Instant) {
    let low = window
        .saturating_sub(since_first.elapsed().as_secs() + 1)
        .max(1);
    assert!(
        (low..=window).contains(&got),
        "{what}: {got} s, expected {low}..={window}"
    );
}

/// `"default";r=R;t=T` -> (R, T).
fn draft_field(value: &str) -> (u64, u64) {
    let rest = value
        .strip_prefix("\"default\";r=")
        .unwrap_or_else(|| panic!("RateLimit: {value}"));
    let (r, t) = rest.split_once(";t=").expect("RateLimit has t");
    (r.parse().expect("r"), t.parse().expect("t"))
}

/// What README promises for an endpoint whose tightest limit is `q` per minute and shows its
/// remaining count, on the `nth` request (1-based) of one client since `since_first`: 200 with
/// sluice's draft headers and Envoy's X-RateLimit-* (one each, agreeing) up to `q`, then 429
/// with `Retry-After` and `x-envoy-ratelimited`. `envoy_limit` is Envoy's X-RateLimit-Limit
/// (the tightest limit, then every limit of the request with its window), `None` where Envoy's
/// headers are off: then none of them may appear.
pub fn assert_visible(
    resp: &HttpResponse,
    nth: u64,
    q: u64,
    envoy_limit: Option<&str>,
    since: Instant,
) {
    let ctx = format!("request {nth} of a limit of {q}: {resp:?}");
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some(format!("\"default\";q={q};w=60").as_str()),
        "{ctx}"
    );
    let (r, t) = draft_field(resp.header("ratelimit").expect("RateLimit"));
    assert_countdown("RateLimit t", t, 60, since);
    assert_eq!(resp.header("x-ratelimit-limit"), envoy_limit, "{ctx}");
    let (t_text, r_text) = (t.to_string(), r.to_string());
    let x = |v: &str| -> Option<String> { envoy_limit.map(|_| v.to_owned()) };
    assert_eq!(
        resp.header("x-ratelimit-reset").map(str::to_owned),
        x(&t_text),
        "{ctx}"
    );
    assert_eq!(
        resp.header("x-ratelimit-remaining").map(str::to_owned),
        x(&r_text),
        "{ctx}"
    );
    if nth <= q {
        assert_eq!(resp.status, 200, "{ctx}");
        assert_eq!(r, q - nth, "{ctx}");
        assert_eq!(resp.header("retry-after"), None, "{ctx}");
        assert_eq!(resp.header("x-envoy-ratelimited"), None, "{ctx}");
    } else {
        assert_eq!(resp.status, 429, "{ctx}");
        assert_eq!(r, 0, "{ctx}");
        assert_eq!(
            resp.header("retry-after"),
            Some(t.to_string().as_str()),
            "{ctx}"
        );
        assert_eq!(resp.header("x-envoy-ratelimited"), Some("true"), "{ctx}");
    }
}

/// `/public` (`hide_remaining`): the limit and, on 429, when to retry; never the remaining
/// count, from sluice or from Envoy.
pub fn assert_hidden(resp: &HttpResponse, nth: u64, since: Instant) {
    let ctx = format!("/public request {nth}: {resp:?}");
    assert_eq!(
        resp.header("ratelimit-policy"),
        Some("\"default\";q=60;w=60"),
        "{ctx}"
    );
    for hidden in [
        "ratelimit",
        "x-ratelimit-remaining",
        "x-ratelimit-limit",
        "x-ratelimit-reset",
    ] {
        assert_eq!(resp.header(hidden), None, "{hidden} on {ctx}");
    }
    if nth <= 60 {
        assert_eq!(resp.status, 200, "{ctx}");
        assert_eq!(resp.header("retry-after"), None, "{ctx}");
    } else {
        assert_eq!(resp.status, 429, "{ctx}");
        let retry: u64 = resp
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        assert_countdown("Retry-After", retry, 60, since);
        assert_eq!(resp.header("x-envoy-ratelimited"), Some("true"), "{ctx}");
    }
}

/// `/login` (5 per minute per client, 300 for the endpoint) at `path`: the 6th request of a
/// client is refused; another client is still admitted. `x`: Envoy's X-RateLimit-Limit, if on.
pub async fn login(addr: SocketAddr, path: &str, x: Option<&str>) {
    let since = Instant::now();
    for nth in 1..=6 {
        let resp = Req::get(path).from("127.0.0.1").send(addr).await;
        assert_visible(&resp, nth, 5, x, since);
    }
    let other = Instant::now();
    let resp = Req::get(path).from("127.0.0.2").send(addr).await;
    assert_visible(&resp, 1, 5, x, other);
}

/// `/api` (120 per minute per client, 200 per second for the endpoint, 600 per minute per API
/// key) at `path` from `from`, with API keys: the 121st request is refused.
pub async fn api(addr: SocketAddr, path: &str, x: Option<&str>, from: &str) {
    let since = Instant::now();
    for nth in 1..=121 {
        let key = format!("key-{}", nth % 7);
        let resp = Req::get(path)
            .header("x-api-key", &key)
            .from(from)
            .send(addr)
            .await;
        assert_visible(&resp, nth, 120, x, since);
    }
}

/// `/public` (60 per minute per client, remaining count hidden) at `path` from `from`.
pub async fn public(addr: SocketAddr, path: &str, from: &str) {
    let since = Instant::now();
    for nth in 1..=61 {
        let resp = Req::get(path).from(from).send(addr).await;
        assert_hidden(&resp, nth, since);
    }
}

/// A path without rate limits: admitted, and no rate-limit header at all.
pub async fn not_limited(addr: SocketAddr, path: &str) {
    let resp = Req::get(path).from("127.0.0.1").send(addr).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, "ok\n");
    for name in resp.names() {
        assert!(
            !name.contains("ratelimit") && name != "retry-after",
            "{resp:?}"
        );
    }
}
