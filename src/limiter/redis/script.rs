//! The Lua that decides a batch atomically inside Redis (a function library) and the script that
//! takes back what a decision recorded, and the pure decoding of their replies.
//!
//! Why Lua: the decision must read every key of the batch, check them all and then write all or
//! nothing. One `FCALL` with every key in `KEYS` runs atomically on the server, in one round
//! trip, so concurrent sidecars can never interleave between check and record. The steps are a
//! transcription of [`crate::limiter::window::decide_batch`] over the per-algorithm models of
//! [`crate::limiter::algorithms`], which are the reference.
//!
//! The Lua lives in `lua/` next to this file: `shared.lua` (number printing, the one-value form
//! of the O(1) states, the undo token of log entries), `models.lua` (every algorithm but the
//! sliding log), `decide.lua` (the steps and the sliding log), `library.lua` (with `models.lua`
//! and `decide.lua`, the library [`LIBRARY`]) and `compensate.lua` (the script [`COMPENSATE`]).
//! Each is assembled at build time: a header generated from the constants below (so Rust and Lua
//! cannot disagree on them), `shared.lua`, then its own files. `KEYS`, `ARGV` and the replies
//! are documented once, on [`LIBRARY`] and [`COMPENSATE`], and named once, in the constants
//! below: every argument and reply element by its offset (`ARG_*`, `REPLY_*`, `UNDO_ARG_*`),
//! which the Lua reads by name, [`ItemArgs`] and the call builders ([`DecideCall`],
//! [`CompensateCall`]) write and [`decode_reply`] reads. The codes the Lua dispatches on belong
//! here too, not to the pure models. The Lua files say what they do with them (steps, data
//! layout in Redis, log members). `scripts/ci/lua-lint.sh` runs luacheck over them.

use crate::limiter::{Algorithm, BatchOutcome, ItemKind, KeyOutcome, LimiterError, OverLimit};
use redis::{Script, Value};
use std::sync::LazyLock;

mod call;
pub use call::{Arg, CompensateCall, DecideCall, ItemArgs};

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
    /// Arguments per batch item in a [`LIBRARY`] call: the item's `ARG_*` offsets, 1 to
    /// `ARGS_PER_ITEM` ([`ItemArgs`] has their meaning).
    ARGS_PER_ITEM: usize = 7;
    /// An item's limit, at `ARGV[at + ARG_LIMIT]` (`at`: the arguments before the item's).
    ARG_LIMIT: usize = 1;
    /// See [`ARG_LIMIT`].
    ARG_WINDOW_MS: usize = 2;
    /// See [`ARG_LIMIT`].
    ARG_HITS: usize = 3;
    /// See [`ARG_LIMIT`].
    ARG_KIND: usize = 4;
    /// See [`ARG_LIMIT`].
    ARG_ALGORITHM: usize = 5;
    /// See [`ARG_LIMIT`].
    ARG_PARAM: usize = 6;
    /// See [`ARG_LIMIT`].
    ARG_OVER_LIMIT: usize = 7;
    /// Elements of a [`LIBRARY`] reply before the items': the verdict.
    REPLY_HEAD: usize = 1;
    /// Elements per item of a [`LIBRARY`] reply: the item's `REPLY_*` offsets, 1 to
    /// `REPLY_PER_ITEM`; item `i`'s (1-based) element `X` is
    /// `REPLY_HEAD + REPLY_PER_ITEM × (i - 1) + REPLY_X` (1-based, as Lua counts).
    REPLY_PER_ITEM: usize = 4;
    /// See [`REPLY_PER_ITEM`].
    REPLY_PASSED: usize = 1;
    /// See [`REPLY_PER_ITEM`].
    REPLY_COUNT: usize = 2;
    /// See [`REPLY_PER_ITEM`].
    REPLY_RESET_MS: usize = 3;
    /// See [`REPLY_PER_ITEM`].
    REPLY_UNDO: usize = 4;
    /// Arguments per key in a [`COMPENSATE`] call, at `ARGV[at + UNDO_ARG_*]`.
    UNDO_ARGS_PER_KEY: usize = 4;
    /// See [`UNDO_ARGS_PER_KEY`].
    UNDO_ARG_ALGORITHM: usize = 1;
    /// See [`UNDO_ARGS_PER_KEY`].
    UNDO_ARG_TOKEN: usize = 2;
    /// See [`UNDO_ARGS_PER_KEY`].
    UNDO_ARG_HITS: usize = 3;
    /// See [`UNDO_ARGS_PER_KEY`].
    UNDO_ARG_WINDOW_MS: usize = 4;
    /// Largest number sent to the scripts, 2^52. Lua numbers are doubles, exact up to 2^53;
    /// capping every input at 2^52 keeps sums of two of them exact. Limits are capped at
    /// `MAX_EXACT - 1` (no real limit is near it, and Redis could not hold that many members
    /// anyway), so a capped `hits` still exceeds every limit, exactly like the original value.
    MAX_EXACT: u64 = 4503599627370496;
    /// A sliding-log entry's member starts with its number, one of the integers
    /// `LOG_MEMBER_FIRST..=LOG_MEMBER_LAST` assigned cyclically per key (see `log_add` in
    /// `lua/decide.lua`).
    LOG_MEMBER_FIRST: u64 = 1000000;
    /// See [`LOG_MEMBER_FIRST`].
    LOG_MEMBER_LAST: u64 = 8388607;
    /// The member of a sliding-log key that holds the key's total (the sum of its entries'
    /// weights) as its score, negated, so that it sorts below every entry.
    LOG_TOTAL_MEMBER: &str = "t";
    /// `ARGV[1]` of a batched call (several requests in one call).
    BATCHED: &str = "b";
    /// Item kinds in `ARGV` ([`kind_code`]).
    KIND_CONSUME: &str = "c";
    /// See [`KIND_CONSUME`].
    KIND_SHADOW: &str = "s";
    /// See [`KIND_CONSUME`].
    KIND_REFUND: &str = "r";
    /// See [`KIND_CONSUME`].
    KIND_QUOTA: &str = "q";
    /// Algorithm codes in `ARGV` ([`algorithm_code`]).
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
    /// [`OverLimit`] codes in `ARGV` ([`over_limit_code`]).
    OVER_LIMIT_REFUSE: &str = "n";
    /// See [`OVER_LIMIT_REFUSE`].
    OVER_LIMIT_FILL: &str = "f";
    /// See [`OVER_LIMIT_REFUSE`].
    OVER_LIMIT_RECORD: &str = "a";
}

/// Whether `offsets` name each position `1..=len` exactly once.
const fn is_layout(offsets: &[usize], len: usize) -> bool {
    if offsets.len() != len {
        return false;
    }
    let mut seen = [false; 64];
    let mut i = 0;
    while i < offsets.len() {
        let at = offsets[i];
        if at == 0 || at > len || at > seen.len() || seen[at - 1] {
            return false;
        }
        seen[at - 1] = true;
        i += 1;
    }
    true
}

const _: () = assert!(is_layout(
    &[
        ARG_LIMIT,
        ARG_WINDOW_MS,
        ARG_HITS,
        ARG_KIND,
        ARG_ALGORITHM,
        ARG_PARAM,
        ARG_OVER_LIMIT
    ],
    ARGS_PER_ITEM
));
const _: () = assert!(is_layout(
    &[REPLY_PASSED, REPLY_COUNT, REPLY_RESET_MS, REPLY_UNDO],
    REPLY_PER_ITEM
));
const _: () = assert!(is_layout(
    &[
        UNDO_ARG_ALGORITHM,
        UNDO_ARG_TOKEN,
        UNDO_ARG_HITS,
        UNDO_ARG_WINDOW_MS
    ],
    UNDO_ARGS_PER_KEY
));

const _: () = assert!(MAX_EXACT == 1 << 52 && MAX_EXACT == crate::limiter::MAX_COUNT);
const _: () = assert!(LOG_MEMBER_FIRST == 1_000_000 && LOG_MEMBER_LAST == (1 << 23) - 1);

/// The declaration line of the compensation script, as a literal for `concat!`
/// ([`COMPENSATE_SHEBANG`]).
macro_rules! compensate_shebang {
    () => {
        "#!lua flags=allow-oom"
    };
}

/// The first lines of every script: each constant above as a Lua local of the same name.
pub const LUA_HEADER: &str = lua_header!();

/// The code of the decide library ([`LIBRARY`]) after its first two lines: the header, then
/// `shared.lua`, `models.lua`, `decide.lua` and `library.lua`, which registers the function.
const LIBRARY_CODE: &str = concat!(
    lua_header!(),
    include_str!("lua/shared.lua"),
    include_str!("lua/models.lua"),
    include_str!("lua/decide.lua"),
    include_str!("lua/library.lua")
);

/// The decide library: a Redis function library (`FUNCTION LOAD`) of one function,
/// [`Library::decide`], which decides a batch, or several (batched call). Callers build its
/// calls with [`DecideCall`] and send them as `FCALL <decide> <numkeys> KEYS... ARGV...`.
///
/// Why a function rather than a script: Redis runs a script's whole chunk on every call, so each
/// of its local functions is made anew per call (a closure, and its upvalues), which cost about
/// as much as the decision itself; a library's chunk runs once, when it is loaded, and a call
/// runs only the function (docs/performance.md, "Redis's side: instructions per request").
/// Redis keeps loaded functions across `FLUSHALL` and replicates them, but not across a restart
/// without persistence or a `FUNCTION FLUSH`: an `FCALL` then answers `Function not found`
/// ([`is_function_missing`]), and the caller loads the library and sends the call again.
/// The library's name and the function's carry a hash of its code, so that two versions of
/// sluice on one Redis (a rolling upgrade) never replace each other's.
///
///
/// `KEYS`: one per batch item, in batch order (a key may repeat; repeats are cumulative). A key
/// is used with one algorithm only (the engine puts the algorithm in the key); a call that mixes
/// two on one key is refused.
///
/// `ARGV`: `ARGV[1]` is the clock: `now` in whole ms, or the empty string to read Redis `TIME`
/// (production: every sidecar then uses the same clock, however skewed their hosts are; an
/// explicit `now` is for tests, and a fraction is refused, `sluice: bad now`). Then
/// [`ARGS_PER_ITEM`] per item, [`ItemArgs`] at their `ARG_*` offsets: item `i` (1-based) reads
/// `ARGV[at + ARG_LIMIT]` etc. with `at = 1 + ARGS_PER_ITEM × (i - 1)`.
///
/// Reply: a flat array of integers, [`REPLY_HEAD`] + [`REPLY_PER_ITEM`] × n long: the verdict
/// (`admitted`, 0 or 1), then per item at its `REPLY_*` offsets `passed` (0 or 1), `count` (what
/// counts against the item's capacity after the decision), `reset_ms` (as the reference models
/// define it, [`crate::limiter::algorithms`]) and `undo`: 0 when the item added nothing, else a
/// token below 2^53 from which [`COMPENSATE`] takes the item's hits back (its form per algorithm:
/// `log_add` in `lua/decide.lua`, `record` in `lua/models.lua`). Malformed arguments give an error
/// reply starting with `sluice:` before any key is touched, and a log key whose members would wrap
/// onto live ones gives one before anything is written (it takes about 7.4 million live entries).
///
/// Batched call (several requests in one call, see the `batch` module): `ARGV[1]` is
/// [`BATCHED`], `ARGV[2]` the clock as above, `ARGV[3]` the number of requests `G`,
/// `ARGV[4 .. 3 + G]` each request's item count, then every request's items in order; `KEYS`
/// are every request's keys in the same order. The requests are decided one after the other,
/// each exactly as a call of its own would be (all sharing one `now`), and the reply is an array
/// of `G` replies as above (an error element for a request whose arguments are malformed or
/// whose keys hold another type of value, `WRONGTYPE`; that request records nothing and the
/// others are unaffected).
///
/// What the script does with them is written in its files: the steps, the sliding log's data
/// and members at the top of `lua/decide.lua`, the other algorithms' data in `lua/models.lua`.
///
/// The function is registered without flags (like a script declared without any), so that an
/// out-of-memory Redis refuses the whole call before any command of it runs (docs/redis.md,
/// "Redis out of memory"). Needs Redis 7.0 or later.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    // The first 16 hex digits of the code's SHA-1 (redis-rs computes a script's hash).
    let hash = Script::new(LIBRARY_CODE).get_hash()[..16].to_owned();
    let decide = format!("sluice_decide_{hash}");
    Library {
        source: format!(
            "#!lua name=sluice_{hash}\nlocal DECIDE_FUNCTION = '{decide}'\n{LIBRARY_CODE}"
        ),
        decide,
    }
});

/// The decide library's source and its function's name ([`LIBRARY`]).
#[derive(Debug)]
pub struct Library {
    /// The text `FUNCTION LOAD` takes: the declaration line (`#!lua name=...`), the function's
    /// name as a Lua local, then the code.
    pub source: String,
    /// The name of the function that decides, for `FCALL`.
    pub decide: String,
}

impl Library {
    /// `FUNCTION LOAD REPLACE` of the library (REPLACE: loading it again where it is loaded,
    /// after a race with another sidecar, is no error).
    pub fn load(&self) -> redis::Cmd {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&self.source);
        load
    }

    /// An `FCALL` of the decide function, to which a [`DecideCall`] writes its keys and
    /// arguments.
    pub fn fcall(&self) -> redis::Cmd {
        let mut fcall = redis::cmd("FCALL");
        fcall.arg(&self.decide);
        fcall
    }
}

/// Whether `e` is Redis's answer to an `FCALL` of a function it does not hold (after a restart
/// without persistence, a `FUNCTION FLUSH`, or on a node that never had it): the function did
/// not run.
pub fn is_function_missing(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && e.detail() == Some("Function not found")
}

/// Takes back exactly what earlier [`LIBRARY`] calls recorded (the cluster backend's
/// compensation); callers build its calls with [`CompensateCall`]. `KEYS`: the keys; `ARGV[1]`:
/// the clock argument the [`LIBRARY`] call was sent with (a log entry's time is found again near
/// it), then [`UNDO_ARGS_PER_KEY`] per key at their `UNDO_ARG_*` offsets: the `algorithm` code,
/// the item's `undo` token from that call's reply (non-zero), its `hits` and its `window_ms`
/// (each at most [`MAX_EXACT`]). Reply: the hits taken back; malformed arguments give an error
/// reply starting with `sluice:` before any key is touched. How each algorithm's hits are found
/// again: `lua/compensate.lua`.
///
/// Declared `allow-oom` ([`COMPENSATE_SHEBANG`]): it must run when Redis is full too.
pub const COMPENSATE: &str = concat!(
    compensate_shebang!(),
    "\n",
    lua_header!(),
    include_str!("lua/shared.lua"),
    include_str!("lua/compensate.lua")
);

/// The first line of [`COMPENSATE`].
pub const COMPENSATE_SHEBANG: &str = compensate_shebang!();

/// The code of an item kind in `ARGV` (`KIND_*`).
pub const fn kind_code(kind: ItemKind) -> &'static str {
    match kind {
        ItemKind::Consume => KIND_CONSUME,
        ItemKind::Shadow => KIND_SHADOW,
        ItemKind::Refund => KIND_REFUND,
        ItemKind::Quota => KIND_QUOTA,
    }
}

/// The code of an algorithm in `ARGV` (`ALGORITHM_*`).
pub const fn algorithm_code(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingLog => ALGORITHM_SLIDING_LOG,
        Algorithm::QuantizedLog { .. } => ALGORITHM_QUANTIZED_LOG,
        Algorithm::SlidingCounter => ALGORITHM_SLIDING_COUNTER,
        Algorithm::Gcra { .. } => ALGORITHM_GCRA,
        Algorithm::FixedWindow => ALGORITHM_FIXED_WINDOW,
        Algorithm::InFlight => ALGORITHM_IN_FLIGHT,
    }
}

/// The code of an [`OverLimit`] in `ARGV` (`OVER_LIMIT_*`).
pub const fn over_limit_code(over_limit: OverLimit) -> &'static str {
    match over_limit {
        OverLimit::Refuse => OVER_LIMIT_REFUSE,
        OverLimit::Fill => OVER_LIMIT_FILL,
        OverLimit::Record => OVER_LIMIT_RECORD,
    }
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

/// Decodes the script's reply for a batch of `items` items (layout documented on [`LIBRARY`]).
pub fn decode_reply(value: &Value, items: usize) -> Result<BatchOutcome, LimiterError> {
    decode_reply_with_undo(value, items).map(|(outcome, _)| outcome)
}

/// Like [`decode_reply`], also returning each item's undo token (0: added nothing).
pub fn decode_reply_with_undo(
    value: &Value,
    items: usize,
) -> Result<(BatchOutcome, Vec<u64>), LimiterError> {
    let Value::Array(values) = value else {
        return Err(LimiterError::Protocol(format!(
            "script reply is not an array: {value:?}"
        )));
    };
    let expected = items
        .checked_mul(REPLY_PER_ITEM)
        .and_then(|n| n.checked_add(REPLY_HEAD))
        .unwrap_or(usize::MAX);
    if values.len() != expected {
        return Err(LimiterError::Protocol(format!(
            "script reply has {} elements, expected {expected}",
            values.len()
        )));
    }
    // Element `i`, counted from 1 as the script (and the layout on `LIBRARY`) counts them.
    let int = |i: usize| -> Result<u64, LimiterError> {
        match values.get(i - 1) {
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
    let admitted = flag(1)?;
    let mut outcomes = Vec::with_capacity(items);
    let mut undo = Vec::with_capacity(items);
    for k in 0..items {
        let at = REPLY_HEAD + REPLY_PER_ITEM * k;
        outcomes.push(KeyOutcome {
            passed: flag(at + REPLY_PASSED)?,
            count: int(at + REPLY_COUNT)?,
            reset_ms: int(at + REPLY_RESET_MS)?,
        });
        undo.push(int(at + REPLY_UNDO)?);
    }
    Ok((BatchOutcome::from_backend(admitted, outcomes), undo))
}

#[cfg(test)]
mod tests;
