//! Building the calls of the Lua: the `KEYS` and `ARGV` of a [`LIBRARY`](super::LIBRARY) or
//! [`COMPENSATE`](super::COMPENSATE) call, each value at the offset script.rs names for it.

use redis::{RedisWrite, Script, ScriptInvocation, ToRedisArgs};

use super::{
    ARG_ALGORITHM, ARG_HITS, ARG_KIND, ARG_LIMIT, ARG_OVER_LIMIT, ARG_PARAM, ARG_WINDOW_MS,
    ARGS_PER_ITEM, BATCHED, MAX_EXACT, UNDO_ARG_ALGORITHM, UNDO_ARG_HITS, UNDO_ARG_TOKEN,
    UNDO_ARG_WINDOW_MS, UNDO_ARGS_PER_KEY, algorithm_code, kind_code, over_limit_code,
};
use crate::limiter::{Algorithm, Item};

/// The clock argument: the explicit clock in ms, or empty for Redis `TIME`.
fn now_arg(now: Option<u64>) -> String {
    now.map_or_else(String::new, |n| n.min(MAX_EXACT).to_string())
}

/// One `ARGV` value: a decimal integer or a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    Number(u64),
    Text(&'a str),
}

impl ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Number(n) => n.write_redis_args(out),
            Arg::Text(s) => s.write_redis_args(out),
        }
    }
}

/// One batch item's [`ARGS_PER_ITEM`](super::ARGS_PER_ITEM) arguments in a
/// [`LIBRARY`](super::LIBRARY) call, as sent: every number is capped at
/// [`MAX_EXACT`](super::MAX_EXACT) (limits and the parameter one below, see there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemArgs {
    /// `ARG_LIMIT`: the limit (GCRA: the rate per window).
    pub limit: u64,
    /// `ARG_WINDOW_MS`: the window (`in_flight`: the lease) in ms.
    pub window_ms: u64,
    /// `ARG_HITS`: the item's cost.
    pub hits: u64,
    /// `ARG_KIND`: a `KIND_*` code ([`kind_code`](super::kind_code)).
    pub kind: &'static str,
    /// `ARG_ALGORITHM`: an `ALGORITHM_*` code ([`algorithm_code`](super::algorithm_code)).
    pub algorithm: &'static str,
    /// `ARG_PARAM`: the algorithm's parameter: the quantized log's quantum in ms, GCRA's burst,
    /// `in_flight`'s lease token, the sliding log's hold ([`Item::hold_ms`]); 0 for the others.
    pub param: u64,
    /// `ARG_OVER_LIMIT`: an `OVER_LIMIT_*` code ([`over_limit_code`](super::over_limit_code)).
    pub over_limit: &'static str,
}

impl ItemArgs {
    /// The arguments of `item`.
    pub fn of(item: &Item) -> Self {
        let param = match item.algorithm {
            Algorithm::QuantizedLog { quantum_ms } => quantum_ms,
            Algorithm::Gcra { burst } => burst,
            Algorithm::InFlight => item.lease,
            Algorithm::SlidingLog => item.hold_ms,
            Algorithm::SlidingCounter | Algorithm::FixedWindow => 0,
        };
        // Limits cap one below hits, so that a clamped huge `hits` still fails like the
        // original, and still counts as at least any limit for later items on the key.
        ItemArgs {
            limit: item.limit.min(MAX_EXACT - 1),
            window_ms: item.window_ms.min(MAX_EXACT),
            hits: item.hits.min(MAX_EXACT),
            kind: kind_code(item.kind),
            algorithm: algorithm_code(item.algorithm),
            param: param.min(MAX_EXACT - 1),
            over_limit: over_limit_code(item.over_limit),
        }
    }

    /// The values in `ARGV` order, each at its `ARG_*` offset.
    pub fn argv(&self) -> [Arg<'static>; ARGS_PER_ITEM] {
        let mut argv = [Arg::Number(0); ARGS_PER_ITEM];
        argv[ARG_LIMIT - 1] = Arg::Number(self.limit);
        argv[ARG_WINDOW_MS - 1] = Arg::Number(self.window_ms);
        argv[ARG_HITS - 1] = Arg::Number(self.hits);
        argv[ARG_KIND - 1] = Arg::Text(self.kind);
        argv[ARG_ALGORITHM - 1] = Arg::Text(self.algorithm);
        argv[ARG_PARAM - 1] = Arg::Number(self.param);
        argv[ARG_OVER_LIMIT - 1] = Arg::Text(self.over_limit);
        argv
    }
}

/// A [`LIBRARY`](super::LIBRARY) call: the `KEYS` and `ARGV` of one request, or of several (a
/// batched call), in the layout documented there. Every caller of the library builds its call
/// here: the limiters, and the tests and benchmarks that call the Lua directly.
#[derive(Debug, Clone)]
pub struct DecideCall<'a> {
    clock: String,
    batched: bool,
    requests: Vec<&'a [Item]>,
}

impl<'a> DecideCall<'a> {
    /// The call of one request on the clock `now` (`None`: Redis `TIME`).
    pub fn single(items: &'a [Item], now: Option<u64>) -> Self {
        DecideCall {
            clock: now_arg(now),
            batched: false,
            requests: vec![items],
        }
    }

    /// A batched call of `requests`, decided one after the other on the clock `now`.
    pub fn batched(requests: Vec<&'a [Item]>, now: Option<u64>) -> Self {
        DecideCall {
            clock: now_arg(now),
            batched: true,
            requests,
        }
    }

    /// The same call with `clock` sent as the clock argument, as it is (for tests of a
    /// malformed clock).
    pub fn with_clock_arg(self, clock: impl Into<String>) -> Self {
        DecideCall {
            clock: clock.into(),
            ..self
        }
    }

    fn items(&self) -> impl Iterator<Item = &'a Item> + '_ {
        self.requests.iter().flat_map(|request| request.iter())
    }

    /// Calls `arg` with each `ARGV` value, in order.
    fn each_arg(&self, mut arg: impl FnMut(Arg<'_>)) {
        if self.batched {
            arg(Arg::Text(BATCHED));
            arg(Arg::Text(&self.clock));
            arg(Arg::Number(self.requests.len() as u64));
            for request in &self.requests {
                arg(Arg::Number(request.len() as u64));
            }
        } else {
            arg(Arg::Text(&self.clock));
        }
        for item in self.items() {
            for value in ItemArgs::of(item).argv() {
                arg(value);
            }
        }
    }

    /// Appends the call's key count, `KEYS` and `ARGV` to `cmd`, an `FCALL` of the library's
    /// function ([`Library::fcall`](super::Library::fcall)).
    pub fn write(&self, cmd: &mut redis::Cmd) {
        let keys: usize = self.requests.iter().map(|request| request.len()).sum();
        cmd.arg(keys);
        for item in self.items() {
            cmd.arg(item.key.as_str());
        }
        self.each_arg(|value| {
            cmd.arg(value);
        });
    }

    /// The call as an `FCALL` of the library's decide function (which the caller loads).
    pub fn fcall(&self) -> redis::Cmd {
        let mut fcall = super::LIBRARY.fcall();
        self.write(&mut fcall);
        fcall
    }
}

/// A [`COMPENSATE`](super::COMPENSATE) call: the items to take back, each with the undo token its
/// [`LIBRARY`](super::LIBRARY) call returned, on that call's clock.
#[derive(Debug, Clone)]
pub struct CompensateCall<'a> {
    clock: String,
    undo: Vec<(&'a Item, u64)>,
}

impl<'a> CompensateCall<'a> {
    /// A call on the clock `now` the [`LIBRARY`](super::LIBRARY) calls were sent with, taking nothing
    /// back yet.
    pub fn new(now: Option<u64>) -> Self {
        CompensateCall {
            clock: now_arg(now),
            undo: Vec::new(),
        }
    }

    /// Adds `item`, to which its [`LIBRARY`](super::LIBRARY) call answered undo token `token`
    /// (non-zero).
    pub fn undo(&mut self, item: &'a Item, token: u64) -> &mut Self {
        self.undo.push((item, token));
        self
    }

    /// Whether the call takes nothing back (then it need not be sent).
    pub fn is_empty(&self) -> bool {
        self.undo.is_empty()
    }

    /// One key's values in `ARGV` order, each at its `UNDO_ARG_*` offset.
    fn argv(item: &Item, token: u64) -> [Arg<'static>; UNDO_ARGS_PER_KEY] {
        let mut argv = [Arg::Number(0); UNDO_ARGS_PER_KEY];
        argv[UNDO_ARG_ALGORITHM - 1] = Arg::Text(algorithm_code(item.algorithm));
        argv[UNDO_ARG_TOKEN - 1] = Arg::Number(token);
        argv[UNDO_ARG_HITS - 1] = Arg::Number(item.hits.min(MAX_EXACT));
        argv[UNDO_ARG_WINDOW_MS - 1] = Arg::Number(item.window_ms.min(MAX_EXACT));
        argv
    }

    /// The call as an invocation of `script` (the [`COMPENSATE`](super::COMPENSATE) script).
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        invocation.arg(self.clock.as_str());
        for &(item, token) in &self.undo {
            invocation
                .key(item.key.as_str())
                .arg(&Self::argv(item, token)[..]);
        }
        invocation
    }
}
