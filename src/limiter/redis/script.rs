//! The Lua scripts that decide a batch atomically inside Redis and take back what a decision
//! recorded, and the pure decoding of their replies.
//!
//! Why a script: the decision must read every key of the batch, check them all and then write
//! all or nothing. One `EVALSHA` with every key in `KEYS` runs atomically on the server, in one
//! round trip, so concurrent sidecars can never interleave between check and record. The steps
//! are a transcription of [`crate::limiter::window::decide_batch`] over the per-algorithm
//! models of [`crate::limiter::algorithms`], which are the reference.
//!
//! The Lua lives in `lua/` next to this file: `shared.lua` (number printing, the one-value form
//! of the O(1) states, the undo token of log entries), `models.lua` (every algorithm but the
//! sliding log), `decide.lua` (the steps and the sliding log; with `models.lua`, [`SCRIPT`]) and
//! `compensate.lua` ([`COMPENSATE`]). Each script is assembled at build time: a header generated
//! from the constants below (so Rust and Lua cannot disagree on them), `shared.lua`, then the
//! script's own files. `KEYS`, `ARGV` and the replies are documented once, on [`SCRIPT`] and
//! [`COMPENSATE`]; the Lua files say what the scripts do with them (steps, data layout in Redis,
//! log members). `scripts/ci/lua-lint.sh` runs luacheck over them.

use crate::limiter::{BatchOutcome, Hit, HitKind, KeyOutcome, LimiterError};
use redis::{Script, ScriptInvocation, Value};

/// Declares each constant that Rust and the scripts share once: as a Rust constant, and as a
/// `local NAME = value` line of [`LUA_HEADER`], which starts every script.
macro_rules! shared_with_lua {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:literal;)+) => {
        $($(#[$doc])* pub const $name: $ty = $value;)+

        macro_rules! lua_header {
            () => {
                concat!(
                    "-- Generated from the constants of src/limiter/redis/script.rs.\n",
                    $("local ", stringify!($name), " = ", stringify!($value), "\n",)+
                )
            };
        }
    };
}

shared_with_lua! {
    /// Arguments per batch item in a [`SCRIPT`] call (see its layout).
    ARGS_PER_ITEM: usize = 7;
    /// Arguments per key in a [`COMPENSATE`] call.
    UNDO_ARGS_PER_KEY: usize = 4;
    /// Largest number sent to the scripts, 2^52. Lua numbers are doubles, exact up to 2^53;
    /// capping every input at 2^52 keeps sums of two of them exact. Limits are capped at
    /// `MAX_EXACT - 1` (no real limit is near it, and Redis could not hold that many members
    /// anyway), so a capped `hits` still exceeds every limit, exactly like the original value.
    MAX_EXACT: u64 = 4503599627370496;
    /// A sliding-log entry's member starts with its number, one of the integers
    /// `LOG_MEMBER_FIRST..=LOG_MEMBER_LAST` assigned cyclically per key: 7 digits, which a
    /// listpack stores as a 24-bit integer (5 bytes) when the entry's weight is 1. A heavier
    /// entry's member is the number followed by its weight in decimal (`1000003` weighs 1,
    /// `10000032000` 2000): see "Log entries" in `lua/decide.lua`.
    LOG_MEMBER_FIRST: u64 = 1000000;
    /// See [`LOG_MEMBER_FIRST`].
    LOG_MEMBER_LAST: u64 = 8388607;
    /// The member of a sliding-log key that holds the key's total (the sum of its entries'
    /// weights) as its score, negated, so that it sorts below every entry.
    LOG_TOTAL_MEMBER: &str = "t";
    /// `ARGV[1]` of a batched call (several requests in one call).
    BATCHED: &str = "b";
    /// Item kinds in `ARGV` (see [`crate::limiter::HitKind`]).
    KIND_CONSUME: &str = "c";
    /// See [`KIND_CONSUME`].
    KIND_SHADOW: &str = "s";
    /// See [`KIND_CONSUME`].
    KIND_REFUND: &str = "r";
    /// See [`KIND_CONSUME`].
    KIND_QUOTA: &str = "q";
    /// Algorithm codes in `ARGV`: [`crate::limiter::Algorithm::code`] (a test holds them equal).
    ALGORITHM_SLIDING_LOG: &str = "l";
    /// See [`ALGORITHM_SLIDING_LOG`].
    ALGORITHM_QUANTIZED_LOG: &str = "q";
    /// See [`ALGORITHM_SLIDING_LOG`].
    ALGORITHM_SLIDING_COUNTER: &str = "s";
    /// See [`ALGORITHM_SLIDING_LOG`].
    ALGORITHM_GCRA: &str = "g";
    /// See [`ALGORITHM_SLIDING_LOG`].
    ALGORITHM_FIXED_WINDOW: &str = "f";
    /// See [`ALGORITHM_SLIDING_LOG`].
    ALGORITHM_IN_FLIGHT: &str = "i";
    /// [`crate::limiter::OverLimit`] codes in `ARGV` ([`crate::limiter::OverLimit::code`]; a
    /// test holds them equal).
    OVER_LIMIT_REFUSE: &str = "n";
    /// See [`OVER_LIMIT_REFUSE`].
    OVER_LIMIT_FILL: &str = "f";
    /// See [`OVER_LIMIT_REFUSE`].
    OVER_LIMIT_RECORD: &str = "a";
}

const _: () = assert!(MAX_EXACT == 1 << 52 && MAX_EXACT == crate::limiter::MAX_COUNT);
const _: () = assert!(LOG_MEMBER_FIRST == 1_000_000 && LOG_MEMBER_LAST == (1 << 23) - 1);

/// The declaration lines of the scripts, as literals for `concat!` ([`SCRIPT_SHEBANG`],
/// [`COMPENSATE_SHEBANG`]).
macro_rules! script_shebang {
    () => {
        "#!lua"
    };
}
macro_rules! compensate_shebang {
    () => {
        "#!lua flags=allow-oom"
    };
}

/// The first lines of every script: each constant above as a Lua local of the same name.
pub const LUA_HEADER: &str = lua_header!();

/// Decides a batch, or several (batched call). The KEYS/ARGV layout, shared by every caller:
///
/// `KEYS`: one per batch item, in batch order (a key may repeat; repeats are cumulative). A key
/// is used with one algorithm only (the engine puts the algorithm in the key); a call that mixes
/// two on one key is refused.
///
/// `ARGV`:
/// - `ARGV[1]`: `now` in whole ms, or the empty string to read Redis `TIME` (production: every
///   sidecar then uses the same clock, however skewed their hosts are). An explicit `now` is for
///   tests; a fraction is refused (`sluice: bad now`), since scores are printed as integers.
/// - then [`ARGS_PER_ITEM`] per item `i` (1-based), from `ARGV[2 + ARGS_PER_ITEM × (i - 1)]`:
///   `limit`, `window_ms`, `hits`, `kind` ([`KIND_CONSUME`], [`KIND_SHADOW`], [`KIND_REFUND`],
///   [`KIND_QUOTA`]), `algorithm` ([`crate::limiter::Algorithm::code`]: [`ALGORITHM_SLIDING_LOG`]
///   and the other `ALGORITHM_*`), its parameter ([`Hit::param`]: the quantized log's quantum in
///   ms, GCRA's burst, `in_flight`'s lease token; else 0) and `over_limit`
///   ([`OVER_LIMIT_REFUSE`], [`OVER_LIMIT_FILL`], [`OVER_LIMIT_RECORD`]). Numbers are decimal
///   integers, each at most [`MAX_EXACT`] (limits, bursts and lease tokens at most
///   `MAX_EXACT - 1`).
///
/// Reply: a flat array of integers, `1 + 4n` long:
/// `{admitted, passed_1, count_1, reset_ms_1, ..., passed_n, count_n, reset_ms_n, undo_1, ...,
/// undo_n}` with `admitted`/`passed` 0 or 1, `count` what counts against the item's capacity
/// after the decision, `reset_ms` as the reference models define it
/// ([`crate::limiter::algorithms`]) and `undo` 0 when the item added nothing, else a token
/// below 2^53 from which [`COMPENSATE`] takes the item's hits back (its form per algorithm:
/// `lua/decide.lua`, "Undo tokens"). Malformed arguments give an error reply starting with
/// `sluice:` before any key is touched, and a log key whose members would wrap onto live ones
/// gives one before anything is written (it takes about 7.4 million live entries).
///
/// Batched call (several requests in one call, see the `batch` module): `ARGV[1]` is
/// [`BATCHED`], `ARGV[2]` the clock as above, `ARGV[3]` the number of requests `G`,
/// `ARGV[4 .. 3 + G]` each request's item count, then every request's items
/// ([`ARGS_PER_ITEM`] arguments each) in order; `KEYS` are every request's keys in the same
/// order. The requests are decided one after the other, each exactly as a call of its own would
/// be (all sharing one `now`), and the reply is an array of `G` replies as above (an error
/// element for a request whose arguments are malformed or whose keys hold another type of value,
/// `WRONGTYPE`; that request records nothing and the others are unaffected).
///
/// What the script does with them is written in its files: the steps, the sliding log's data and
/// members and what each step costs at the top of `lua/decide.lua`, the other algorithms' data
/// in `lua/models.lua`.
///
/// Its first line declares it the Redis 7 way (`#!lua`, [`SCRIPT_SHEBANG`]) with no flags, so
/// the server checks it before running it: an out-of-memory Redis (`maxmemory` reached under
/// `noeviction`) refuses the whole call with `OOM` before a command of it runs, where a script
/// without the line was refused only until its first write command (the eviction of phase 1), and
/// then grew Redis past `maxmemory`. Nothing else changes for this script: its keys are all in
/// `KEYS` already (in a cluster, a declared script may only touch its own slot, as each call of
/// the cluster backend does), `TIME` is allowed (Redis 7 replicates a script's effects, not the
/// script), and it is not run on read-only replicas. Needs Redis 7.0 or later.
pub const SCRIPT: &str = concat!(
    script_shebang!(),
    "\n",
    lua_header!(),
    include_str!("lua/shared.lua"),
    include_str!("lua/models.lua"),
    include_str!("lua/decide.lua")
);

/// Takes back exactly what earlier [`SCRIPT`] calls recorded (the cluster backend's
/// compensation). `KEYS`: the keys; `ARGV[1]`: the clock argument the [`SCRIPT`] call was sent
/// with (see [`SCRIPT`]; a log entry's time is found again near it), then [`UNDO_ARGS_PER_KEY`]
/// per key, in order: the `algorithm` code, the item's `undo` token from that call's reply
/// (non-zero), its `hits` and its `window_ms` (each at most [`MAX_EXACT`]). Reply: the hits
/// taken back; malformed arguments give an error reply starting with `sluice:` before any key
/// is touched. How each algorithm's hits are found again: `lua/compensate.lua`.
///
/// Declared with `allow-oom` ([`COMPENSATE_SHEBANG`]): it only takes back what [`SCRIPT`]
/// recorded, so it must run exactly when Redis is full too (a script without the declaration is
/// refused at its first `SET`/`HINCRBY` under OOM, leaving the entries it should remove).
pub const COMPENSATE: &str = concat!(
    compensate_shebang!(),
    "\n",
    lua_header!(),
    include_str!("lua/shared.lua"),
    include_str!("lua/compensate.lua")
);

/// The first line of [`SCRIPT`]: declared, no flags (so no `allow-oom`).
pub const SCRIPT_SHEBANG: &str = script_shebang!();
/// The first line of [`COMPENSATE`].
pub const COMPENSATE_SHEBANG: &str = compensate_shebang!();

/// The clock argument (`ARGV[1]`, in a batched call `ARGV[2]`): the explicit clock in ms, or
/// empty for Redis `TIME`.
pub(super) fn now_arg(now: Option<u64>) -> String {
    now.map_or_else(String::new, |n| n.min(MAX_EXACT).to_string())
}

/// One item's [`ARGS_PER_ITEM`] `ARGV` values, in order: limit, window_ms, hits, kind,
/// algorithm code, parameter, over_limit code.
pub(super) type ItemArgs = (u64, u64, u64, &'static str, &'static str, u64, &'static str);

/// The `ARGV` values of `hit` (see [`SCRIPT`]).
pub(super) fn item_args(hit: &Hit) -> ItemArgs {
    // Lua numbers are doubles: every number is capped at 2^52 so sums stay exact. Limits cap one
    // below hits, so that a clamped huge `hits` still fails like the original, and still counts
    // as at least any limit for later items on the key.
    let kind = match hit.kind {
        HitKind::Consume => KIND_CONSUME,
        HitKind::Shadow => KIND_SHADOW,
        HitKind::Refund => KIND_REFUND,
        HitKind::Quota => KIND_QUOTA,
    };
    (
        hit.limit.min(MAX_EXACT - 1),
        hit.window_ms.min(MAX_EXACT),
        hit.hits.min(MAX_EXACT),
        kind,
        hit.algorithm.code(),
        hit.param().min(MAX_EXACT - 1),
        hit.over_limit.code(),
    )
}

/// Appends one item's `ARGV` values to a hand-built `EVALSHA`.
pub(super) fn push_item_args(
    cmd: &mut redis::Cmd,
    (limit, window_ms, hits, kind, algorithm, param, over_limit): ItemArgs,
) {
    cmd.arg(limit)
        .arg(window_ms)
        .arg(hits)
        .arg(kind)
        .arg(algorithm)
        .arg(param)
        .arg(over_limit);
}

/// The unbatched call of [`SCRIPT`] for `batch`.
pub(super) fn invocation<'s>(
    script: &'s Script,
    batch: &[Hit],
    now: Option<u64>,
) -> ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(now_arg(now));
    for hit in batch {
        let (limit, window_ms, hits, kind, algorithm, param, over_limit) = item_args(hit);
        invocation
            .key(hit.key.as_str())
            .arg(limit)
            .arg(window_ms)
            .arg(hits)
            .arg(kind)
            .arg(algorithm)
            .arg(param)
            .arg(over_limit);
    }
    invocation
}

/// The `ARGV` values of a [`COMPENSATE`] call for `hit`, whose [`SCRIPT`] call returned undo
/// token `undo` (after the clock argument, [`now_arg`]).
pub(super) fn undo_args(hit: &Hit, undo: u64) -> [String; UNDO_ARGS_PER_KEY] {
    [
        hit.algorithm.code().to_string(),
        undo.to_string(),
        hit.hits.min(MAX_EXACT).to_string(),
        hit.window_ms.min(MAX_EXACT).to_string(),
    ]
}

/// Decodes the reply of a batched call (`ARGV[1] = "b"`): one reply per group, each decoded by
/// [`decode_reply`] against that group's item count. The outer error is for a reply that is not
/// one array of `sizes.len()` elements; a group the script refused gets its own error.
pub fn decode_batched_reply(
    value: &Value,
    sizes: &[usize],
) -> Result<Vec<Result<BatchOutcome, LimiterError>>, LimiterError> {
    let Value::Array(groups) = value else {
        return Err(LimiterError::Protocol(format!(
            "batched script reply is not an array: {value:?}"
        )));
    };
    if groups.len() != sizes.len() {
        return Err(LimiterError::Protocol(format!(
            "batched script reply has {} groups, expected {}",
            groups.len(),
            sizes.len()
        )));
    }
    Ok(groups
        .iter()
        .zip(sizes)
        .map(|(group, &items)| match group {
            Value::ServerError(e) => Err(refusal(e.code(), e.details())),
            other => decode_reply(other, items),
        })
        .collect())
}

/// The error of a request Redis refused with error `code` (its first word) and `detail`: a
/// request of a batched call (an error element of the reply), or a call of its own.
/// `WRONGTYPE` is the request's own keys' fault ([`LimiterError::Refused`]); `OOM` and `BUSY`
/// mean Redis cannot serve now ([`LimiterError::Unavailable`]); anything else is unexpected.
pub fn refusal(code: &str, detail: Option<&str>) -> LimiterError {
    let detail = detail.unwrap_or_default();
    match code {
        "WRONGTYPE" => LimiterError::Refused(format!(
            "WRONGTYPE: a limiter key of this request holds a value of another type, not one \
             sluice wrote ({detail})"
        )),
        "OOM" | "BUSY" => LimiterError::Unavailable(format!("{code} {detail}")),
        _ => LimiterError::Protocol(format!("script refused: {code} {detail}")),
    }
}

/// Decodes the script's reply for a batch of `items` items (layout documented on [`SCRIPT`]).
pub fn decode_reply(value: &Value, items: usize) -> Result<BatchOutcome, LimiterError> {
    decode_reply_with_added(value, items).map(|(outcome, _)| outcome)
}

/// Like [`decode_reply`], also returning each item's undo token (0: added nothing).
pub fn decode_reply_with_added(
    value: &Value,
    items: usize,
) -> Result<(BatchOutcome, Vec<u64>), LimiterError> {
    let Value::Array(values) = value else {
        return Err(LimiterError::Protocol(format!(
            "script reply is not an array: {value:?}"
        )));
    };
    let expected = items
        .checked_mul(4)
        .and_then(|n| n.checked_add(1))
        .unwrap_or(usize::MAX);
    if values.len() != expected {
        return Err(LimiterError::Protocol(format!(
            "script reply has {} elements, expected {expected}",
            values.len()
        )));
    }
    let int = |i: usize| -> Result<u64, LimiterError> {
        match values.get(i) {
            Some(Value::Int(n)) if *n >= 0 => Ok(*n as u64),
            other => Err(LimiterError::Protocol(format!(
                "script reply element {i} is not a non-negative integer: {other:?}"
            ))),
        }
    };
    let flag = |i: usize| -> Result<bool, LimiterError> {
        match int(i)? {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(LimiterError::Protocol(format!(
                "script reply element {i} is {n}, expected 0 or 1"
            ))),
        }
    };
    let admitted = flag(0)?;
    let items = (0..items)
        .map(|k| {
            let base = 1 + 3 * k;
            Ok(KeyOutcome {
                passed: flag(base)?,
                count: int(base + 1)?,
                reset_ms: int(base + 2)?,
            })
        })
        .collect::<Result<Vec<_>, LimiterError>>()?;
    let added = (0..items.len())
        .map(|k| int(1 + 3 * items.len() + k))
        .collect::<Result<Vec<_>, LimiterError>>()?;
    Ok((BatchOutcome::from_backend(admitted, items), added))
}

#[cfg(test)]
mod tests;
