//! The Lua script that decides one batch atomically inside Redis, and the pure decoding of its
//! reply.
//!
//! Why a script: the decision must read every key of the batch, check them all and then write
//! all or nothing. One `EVALSHA` with every key in `KEYS` runs atomically on the server, in one
//! round trip, so concurrent sidecars can never interleave between check and record. The steps
//! are a transcription of [`crate::limiter::window::decide_batch`] over the per-algorithm
//! models of [`crate::limiter::algorithms`], which are the reference.

use crate::limiter::{BatchOutcome, KeyOutcome, LimiterError};
use redis::Value;

/// Arguments per batch item after `ARGV[1]`.
pub const ARGS_PER_ITEM: usize = 6;

/// Largest number sent to the script. Lua numbers are doubles, exact up to 2^53; capping every
/// input at 2^52 keeps sums of two of them exact. Limits are capped at `MAX_EXACT - 1` (no real
/// limit is near it, and Redis could not hold that many members anyway), so a capped `hits`
/// still exceeds every limit, exactly like the original value.
pub const MAX_EXACT: u64 = 1 << 52;

/// Kind codes in `ARGV`.
pub const KIND_CONSUME: &str = "c";
pub const KIND_SHADOW: &str = "s";
pub const KIND_REFUND: &str = "r";
pub const KIND_QUOTA: &str = "q";

/// The Lua both scripts start with: constants, number formatting and the O(1) value layout.
/// A macro rather than a constant, so that `concat!` can build each script as one literal.
macro_rules! lua_prelude {
    () => {
        r#"
local CHUNK = 1000
local MAX_EXACT = 4503599627370496
-- Log members: 7-digit integers (24-bit listpack integers), assigned cyclically per key.
local MEMBER_LO, MEMBER_HI, MEMBERS = 1000000, 8388607, 7388608
-- Undo token of a log item: (score mod 2^30) * 2^23 + (first member - MEMBER_LO) + 1.
local TOKEN_MEMBER, TOKEN_SCORE = 8388608, 1073741824

-- Decimal digits of an integer below 2^53, for arguments Redis reads as integers (TTLs, counts,
-- hash fields); a fraction is rounded.
local function fmt(x)
  return string.format('%.0f', x)
end

-- The same for a number known to be an integer (times in ms, log members, TTLs derived from
-- them), for less: '%d' prints through the C library's integer path where
-- '%.0f' goes through its floating-point one, and so does Redis 7.0 itself ('%.17g') for a Lua
-- number handed to `redis.call`. Callers guarantee integrality (the clock and windows are
-- checked), since '%d' would truncate a fraction. Lua's '%d' goes through a C `long`: 64 bits
-- wherever Redis runs in production, but 32 on a 32-bit build, where a time in ms would wrap;
-- such a server keeps '%.0f'.
local INT_FORMAT = '%.0f'
if string.format('%d', 1099511627776) == '1099511627776' then
  INT_FORMAT = '%d'
end
local function ifmt(x)
  return string.format(INT_FORMAT, x)
end

local function floor_div(a, b)
  local q = math.floor(a / b)
  while q * b > a do
    q = q - 1
  end
  while (q + 1) * b <= a do
    q = q + 1
  end
  return q
end

-- An O(1) state as one decimal integer (the layout of SCRIPT's doc): the width digit, the
-- counts zero-padded to it, then the time field. Counts of more than 9 digits take the 'n'
-- form. One string.format per value, its pattern built once per width and count number.
local PATTERN = {}
local function compose(counts, t)
  local k, top = #counts, counts[1]
  if k > 1 and counts[2] > top then
    top = counts[2]
  end
  local d, p = 1, 10
  while top >= p and d < 10 do
    d, p = d + 1, p * 10
  end
  if d > 9 then
    local parts = {}
    for j = 1, k do
      parts[j] = fmt(counts[j])
    end
    parts[k + 1] = fmt(t)
    return 'n' .. table.concat(parts, ':')
  end
  local key = k * 10 + d
  local pattern = PATTERN[key]
  if not pattern then
    pattern = d .. string.rep('%0' .. d .. '.0f', k) .. '%.0f'
    PATTERN[key] = pattern
  end
  if k == 1 then
    return string.format(pattern, counts[1], t)
  end
  return string.format(pattern, counts[1], counts[2], t)
end

-- The counts and time field of compose's value; nil for the legacy 'a:b[:c]' form.
local function decompose(v, k)
  local c = {}
  if string.sub(v, 1, 1) == 'n' then
    for x in string.gmatch(string.sub(v, 2), '[^:]+') do
      c[#c + 1] = tonumber(x)
    end
    return c, c[k + 1]
  end
  if string.find(v, ':', 1, true) then
    return nil
  end
  local d = tonumber(string.sub(v, 1, 1)) or 1
  for j = 1, k do
    c[j] = tonumber(string.sub(v, 2 + (j - 1) * d, 1 + j * d))
  end
  return c, tonumber(string.sub(v, 2 + k * d))
end


-- The state in an O(1) key's value `v`, as a, b, c: fixed window start (ms), count, 0; sliding
-- counter start (ms), current count, previous count; GCRA arrival time, remainder, 0 (GCRA's
-- rate `r` converts the previous version's 'last:token-ms'). `w` is the window in ms.
local function read_o1(v, algo, w, r)
  local k = 1
  if algo == 's' then
    k = 2
  end
  local c, t = decompose(v, k)
  if not c then
    -- Written by the previous version: 'start:count[:prev]' or GCRA 'last:token-ms'.
    c = {}
    for x in string.gmatch(v, '[^:]+') do
      c[#c + 1] = tonumber(x)
    end
    local a, b = c[1] or 0, c[2] or 0
    if algo == 'g' then
      local q = floor_div(b, r)
      return a + q, b - q * r, 0
    end
    return a, b, c[3] or 0
  elseif algo == 'g' then
    return t or 0, c[1] or 0, 0
  end
  return (t or 0) * w, c[1] or 0, c[2] or 0
end
"#
    };
}

/// KEYS: one per batch item, in batch order (a key may repeat; repeats are cumulative). A key is
/// used with one algorithm only (the engine puts the algorithm in the key).
///
/// ARGV:
/// - `ARGV[1]`: `now` in whole ms, or the empty string to read Redis `TIME` (production: every
///   sidecar then uses the same clock, however skewed their hosts are). An explicit `now` is for
///   tests; a fraction is refused (`sluice: bad now`), since scores are printed as integers.
/// - then per item `i` (1-based), at `ARGV[2 + 6(i-1)] ..`: `limit`, `window_ms`, `hits`, `kind`
///   (`c` consume, `s` shadow, `r` refund, `q` quota), `algorithm` (the code of
///   [`crate::limiter::Algorithm::code`]: `l` sliding log, `q` quantized log, `s` sliding
///   counter, `g` GCRA, `f` fixed window) and its parameter (quantum ms, burst; else 0).
///   Decimal integers, each at most [`MAX_EXACT`] (limits and bursts at most `MAX_EXACT - 1`).
///
/// Reply: a flat array of integers, `1 + 4n` long:
/// `{admitted, passed_1, count_1, reset_ms_1, ..., passed_n, count_n, reset_ms_n, undo_1, ...,
/// undo_n}` with `admitted`/`passed` 0 or 1, `count` what counts against the item's capacity
/// after the decision, `reset_ms` as the reference models define it
/// ([`crate::limiter::algorithms`]) and `undo` 0 when the item added nothing, else what
/// [`COMPENSATE`] needs to take its hits back: for the log
/// `(score mod 2^30) × 2^23 + (first member − 1000000) + 1` (it added `hits` consecutive members,
/// cyclically, from there, at that score; see the members below); for the quantized log the
/// bucket start + 1; for the fixed window and the sliding counter the window start + 1; for GCRA
/// its rate `max(limit, 1)`. Every token is below 2^53. Malformed arguments give an error reply
/// starting with `sluice:`, and so does a log key whose members would wrap onto live ones
/// (about 7.4 million live entries; checked before anything is written).
///
/// Batched call (several requests in one call, see the `batch` module): `ARGV[1] = "b"`, `ARGV[2]`
/// the clock as above, `ARGV[3]` the number of requests `G`, `ARGV[4 .. 3 + G]` each request's item
/// count, then every request's items (6 arguments each) in order; `KEYS` are every request's keys
/// in the same order. The requests are decided one after the other, each exactly as a call of its
/// own would be (all sharing one `now`), and the reply is an array of `G` replies as above (an
/// error element for a request whose arguments are malformed, the others unaffected).
///
/// The step structure is [`crate::limiter::window::decide_batch`]'s, which is the reference:
/// - Phase 1, per item in order: bring the key to `now` (log: `ZREMRANGEBYSCORE key -inf
///   (now - window)`; quantized log: `HDEL` of buckets with `start + quantum + window <= now`;
///   other algorithms: rotate / decay a copy in Lua), then consume/shadow check
///   `count + earlier + hits <= capacity` (`< capacity` for a `hits = 0` probe), `earlier` being
///   the hits earlier items of the batch would record on the same key (consume always, shadow
///   only if it passed), capacity the limit or, for GCRA, the burst. Quota items are checked the
///   same way; if the batch has any, at least one must pass (`quota_mode`).
/// - Phase 2, only if every consume item passed (and a quota item, if any), in batch order:
///   consume and passed shadow and quota items with `hits > 0` record them; refunds take back up to `hits`, newest first; then each
///   written key gets its TTL, so idle keys vanish on their own. A rejected batch writes nothing
///   but phase 1's evictions and leaves TTLs.
///
/// Data layout per algorithm (MEMORY USAGE measured in docs/algorithms.md):
/// - sliding log: a sorted set with one member per hit; score = the ms it was recorded. TTL: until
///   the newest entry leaves the window.
/// - quantized log: a hash `bucket start (ms) -> hits`; a hit is recorded in the bucket
///   `max(floor(now / quantum) * quantum, newest bucket)`. TTL: until the newest bucket leaves.
/// - the O(1) algorithms keep one decimal integer (one `SET .. PX`). Why: Redis stores a
///   string that is a canonical integer of at most 19 digits inside the object itself (16
///   bytes), where `1764500000000:12` costs a 48-byte allocation. The digits, left to right:
///   `D` (1–9), the width of the count fields; each count field zero-padded to `D` digits; then
///   the time field, unpadded. Lua numbers are doubles, so the value is composed and split as a
///   string, never computed as a number. A value of more than 19 digits (or above 2^63 − 1) is
///   stored all the same, as a string: correctness never depends on the integer encoding. Counts
///   of more than 9 digits use `n<count>:[<count>:]<time>`; a value with `:` and no `n` is the
///   previous version's `a:b[:c]` (`start:count`, `start:cur:prev`, GCRA `last:token-ms`), still
///   read, so keys survive an upgrade (they are rewritten in the new form on their next write):
///   - fixed window: count; time = window index `start / window_ms`. TTL: two windows from its
///     start. `sluice:{edge|user=u10|60000|fw}` holding 12 hits is `21228333334`;
///   - sliding counter: current count, previous window's count; time = the window index. TTL:
///     two windows from its start;
///   - GCRA: remainder `r`; time = the theoretical arrival time `T` (ms). Tokens in use ×
///     window_ms at `now`, in integer token-ms (the refill is exactly `rate = max(limit, 1)`
///     token-ms per ms), are `max(0, (T − now) × rate + r)` with `0 <= r < rate`, capped at
///     [`MAX_EXACT`]; `(0, 0)` is empty (the key is deleted). Recording `h` hits adds
///     `h × window_ms` token-ms to what is in use at `now` and re-derives `T = now +
///     floor(used / rate)`, `r = used mod rate`; a refund takes them off the same way. A clock
///     that lags sees more tokens in use (conservative), never fewer. 13 digits of `T` and the
///     digits of `r` (fewer than the limit's): at limits up to 100,000 the value stays an
///     integer. TTL: until empty, plus one window.
///
/// TTLs outlive the state by about a window so that a lagging clock (`now` behind the last
/// write) finds the same state the memory backend keeps; an emptied key is deleted.
///
/// Log members must be unique per key and short: a listpack stores an integer member of
/// 1000000..=8388607 in 5 bytes (a 24-bit integer; a 16-digit one costs 10, a UUID 37). So they
/// are 7-digit integers assigned cyclically per key: a new key starts at 1000000, then
/// `member = top_member + 1` per hit, wrapping from 8388607 to 1000000, with `top` the last
/// element (`ZRANGE key -1 -1 WITHSCORES`). Scores are kept non-decreasing: `score = max(now_ms,
/// top_score)`. Why this is safe across instances and clock steps:
/// - a fixed width keeps Redis's lexicographic tie-break between equal scores equal to numeric
///   order, and with non-decreasing scores the top element is the last one added: `ZPOPMAX`
///   removes the newest entries, and the next member is derived from the top. At a wrap (and
///   after the previous version's 16-digit members) the new member would sort below the top at
///   an equal score, so it and the rest of its call get `score + 1`: such an entry counts 1 ms
///   longer than the memory backend's would (conservative), once per 7.4 million entries;
/// - entries leave from the bottom (expiry) and the top (refunds), so the live members are one
///   cyclic range; a new member collides with a live one (ZADD would silently update it instead
///   of adding one: over-admission) only if the range's span plus the hits exceed the 7388608
///   numbers. The script checks the span (from `ZRANGE 0 0` and the top, which the reply needs
///   anyway) before writing and fails the call with a `sluice:` error instead;
/// - a score never goes back in time, so a step back of the clock cannot make a new entry expire
///   earlier than the one before it (the memory backend records at `max(now, newest)` too);
/// - numbers stay below 2^53, so Lua computes them exactly; `string.format('%.0f')` prints them
///   (`tostring` would switch to exponent notation).
///
/// The log path reads each key's count once (`ZCARD` after the eviction) and its top and oldest
/// entry at most once each, then keeps them up to date through its own adds and pops: an admitted
/// single-hit item costs `ZREMRANGEBYSCORE`, `ZCARD`, two `ZRANGE`s (none on an empty key),
/// `ZADD` and `PEXPIRE`. A request of nothing but sliding-log consume items on distinct keys (the
/// usual shape) takes a lean path with the same commands and reply, skipping the general path's
/// per-request tables; the non-log algorithms' helpers are only made when an item needs them
/// (instructions per request: docs/performance.md, `scripts/script-cost.sh`).
///
/// Numbers: integer divisions go through `ceil_div`, exact for operands below 2^53; the sliding
/// counter's weight `ceil(prev * left / window)` is the same IEEE-754 double expression as the
/// Rust model's, so both round identically.
///
/// Members go in `ZADD` chunks of at most 1000 (2000 arguments), far below Lua's `unpack` limit.
pub const SCRIPT: &str = concat!(
    lua_prelude!(),
    r#"
local batched = ARGV[1] == 'b'
local clock = ARGV[1]
if batched then
  clock = ARGV[2]
end
local now_ms, now_us
if clock == '' then
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  now_ms = s * 1000 + math.floor(us / 1000)
  now_us = s * 1000000 + us
else
  now_ms = tonumber(clock)
  if not now_ms or now_ms % 1 ~= 0 then
    return redis.error_reply('sluice: bad now')
  end
  now_us = now_ms * 1000
end

-- One request's `KEYS` and `ARGV`: the call's own, or in a batched call a slice of them per
-- request (`ARGV[1]` being the clock), rebound by `decide` before each request, so the code
-- below reads them as in a single call. Helpers are made once per call, not once per request:
-- a closure costs an allocation per captured variable, more than a request's own work.
local CALL_KEYS, CALL_ARGV = KEYS, ARGV
local KEYS, ARGV = KEYS, ARGV
local n = #KEYS

-- Per-request state. `decide` makes its tables afresh for every request; the lean log path
-- only overwrites entries 1..n of the first four, so only those exist from the start.
local limit, window, hits, passed = {}, {}, {}, {}
-- The lean log path's keys and undo tokens of the request (entries 1..n).
local lkey, undo = {}, {}
local kind, algo, param, earlier, st, lg
local any_quota, quota_passed = false, false
local admitted = 1

-- Whether a log member is one of ours (the previous version's were 16 digits).
local function own(m)
  return m and m >= MEMBER_LO and m <= MEMBER_HI
end

-- A log key's newest (`newest`) or oldest entry {member, score}, each read at most once per
-- request and then kept up to date by its own adds and pops (false: the key is empty).
local function log_end(key, newest)
  local lk = lg[key]
  if lk.card == 0 then
    lk.top, lk.old = false, false
    return false
  end
  local field, at = 'old', '0'
  if newest then
    field, at = 'top', '-1'
  end
  if lk[field] == nil then
    local t = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
    -- A score Redis printed is always a number: `+ 0` parses it once, `tonumber` twice.
    lk[field] = {tonumber(t[1]), t[2] + 0}
    if lk.card == 1 then
      lk.top, lk.old = lk[field], lk[field]
    end
  end
  return lk[field]
end

local function log_top(key)
  return log_end(key, true)
end

local function log_old(key)
  return log_end(key, false)
end

-- How many member numbers the key's live entries span, oldest to newest, cyclically. Entries
-- are added at the top and leave from the bottom (expiry) or the top (refunds), so the live
-- members are one cyclic range; cluster compensation may leave holes, hence the span rather
-- than the count. The previous version's members are outside the range and cannot collide.
local function log_span(key)
  local top, old = log_top(key), log_old(key)
  if not top or not own(top[1]) then
    return 0
  end
  local o = MEMBER_LO
  if own(old[1]) then
    o = old[1]
  end
  return (top[1] - o) % MEMBERS + 1
end

-- Adds h entries; returns the undo token (see the reply).
local function add(key, h)
  local lk = lg[key]
  local top = log_top(key)
  log_old(key)
  local score, member = now_ms, MEMBER_LO
  if top then
    if top[2] > score then
      score = top[2]
    end
    if own(top[1]) and top[1] < MEMBER_HI then
      member = top[1] + 1
    elseif score <= top[2] then
      -- A wrap (or the previous version's top): the new member sorts below the top at an
      -- equal score, so it goes 1 ms later to stay the newest.
      score = top[2] + 1
    end
  end
  local token = (score % TOKEN_SCORE) * TOKEN_MEMBER + (member - MEMBER_LO) + 1
  if not lk.old then
    lk.old = {member, score}
  end
  lk.card = lk.card + h
  if h == 1 then
    -- The usual single hit, without the argument table.
    lk.top = {member, score}
    redis.call('ZADD', key, ifmt(score), ifmt(member))
    return token
  end
  while h > 0 do
    local m = h
    if m > CHUNK then
      m = CHUNK
    end
    local args = {}
    local printed = ifmt(score)
    for j = 1, m do
      args[2 * j - 1] = printed
      args[2 * j] = ifmt(member)
      lk.top = {member, score}
      member = member + 1
      if member > MEMBER_HI then
        -- The same at a wrap inside this call.
        member = MEMBER_LO
        score = score + 1
        printed = ifmt(score)
      end
    end
    redis.call('ZADD', key, unpack(args))
    h = h - m
  end
  return token
end

-- Most requests carry nothing but sliding-log consume items on distinct keys. This decides such
-- a request with the same steps, Redis commands and reply as `decide` below (which stays the
-- reference and takes every other request) but without the bookkeeping that other algorithms,
-- kinds and repeated keys need: about 15 % fewer instructions per request. It reads the `n` items
-- from the call's own KEYS and ARGV at offsets `kb` and `ab` (a batched call's requests need no
-- slices). nil when the request has another shape or a malformed argument; nothing has been
-- read or written then.
local function decide_log(kb, ab)
  if n > 8 then
    return nil
  end
  for i = 1, n do
    local a = ab + (i - 1) * 6
    if CALL_ARGV[a + 5] ~= 'l' or CALL_ARGV[a + 4] ~= 'c' then
      return nil
    end
    local key = CALL_KEYS[kb + i]
    for j = 1, i - 1 do
      if lkey[j] == key then
        return nil
      end
    end
    lkey[i] = key
  end
  for i = 1, n do
    local a = ab + (i - 1) * 6
    limit[i], window[i], hits[i] =
      tonumber(CALL_ARGV[a + 1]), tonumber(CALL_ARGV[a + 2]), tonumber(CALL_ARGV[a + 3])
    if not (limit[i] and window[i] and hits[i] and tonumber(CALL_ARGV[a + 6]))
        or window[i] % 1 ~= 0 then
      return nil
    end
  end
  lg = {}
  local ok = 1
  for i = 1, n do
    local key = lkey[i]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', ifmt(now_ms - window[i]))
    local card = redis.call('ZCARD', key)
    -- Room for the `top` and `old` that log_end adds: the constructor sizes the table.
    lg[key] = {card = card, top = nil, old = nil}
    if hits[i] == 0 then
      passed[i] = card < limit[i]
    else
      passed[i] = card + hits[i] <= limit[i]
    end
    if not passed[i] then
      ok = 0
    end
  end
  for i = 1, n do
    undo[i] = 0
  end
  if ok == 1 then
    for i = 1, n do
      if hits[i] > 0 and log_span(lkey[i]) + hits[i] > MEMBERS then
        return redis.error_reply('sluice: sliding log ' .. lkey[i] .. ' is full (members wrap)')
      end
    end
    for i = 1, n do
      if hits[i] > 0 then
        local key = lkey[i]
        undo[i] = add(key, hits[i])
        local ttl = log_top(key)[2] + window[i] - now_ms
        if ttl < 1 then
          ttl = 1
        end
        redis.call('PEXPIRE', key, ifmt(ttl))
      end
    end
  end
  -- Filled in index order, so the table only ever grows its array part (sized for one item).
  local reply = {ok, nil, nil, nil, nil}
  for i = 1, n do
    local old, reset_ms = log_old(lkey[i]), window[i]
    if old then
      reset_ms = old[2] + window[i] - now_ms
      if reset_ms < 0 then
        reset_ms = 0
      end
    end
    local at = 3 * i - 1
    reply[at] = passed[i] and 1 or 0
    reply[at + 1] = lg[lkey[i]].card
    reply[at + 2] = reset_ms
  end
  for i = 1, n do
    reply[1 + 3 * n + i] = undo[i]
  end
  return reply
end

-- An unbatched call of that shape is answered here, before the general path's helpers and
-- `decide` exist: making those closures is about a twentieth of such a call.
if not batched and #ARGV == 1 + 6 * n then
  local fast = decide_log(0, 1)
  if fast then
    return fast
  end
end

-- The other algorithms' helpers, made on a call's first non-log item: every closure costs its
-- upvalues on every call, and most calls carry sliding-log items only.
local o1_helpers
local function o1()
  if o1_helpers then
    return o1_helpers
  end
  local function ceil_div(a, b)
    if a <= 0 or b <= 0 then
      return 0
    end
    local q = math.floor(a / b)
    while q * b < a do
      q = q + 1
    end
    while q > 0 and (q - 1) * b >= a do
      q = q - 1
    end
    return q
  end

  -- GCRA: token-ms in use at `now` of arrival time t and remainder r (at most MAX_EXACT).
  local function gcra_used(t, r, rate, now)
    if t >= now then
      local u = (t - now) * rate + r
      if u > MAX_EXACT then
        u = MAX_EXACT
      end
      return u
    end
    local back = (now - t) * rate
    if back >= r then
      return 0
    end
    return r - back
  end

  local function wnd(i)
    if window[i] < 1 then
      return 1
    end
    return window[i]
  end

  local function quantum(i)
    if param[i] < 1 then
      return 1
    end
    return param[i]
  end

  -- GCRA's refill in token-ms per ms (a limit of 0 refills like 1; its capacity is 0 anyway).
  local function rate(i)
    if limit[i] < 1 then
      return 1
    end
    return limit[i]
  end

  -- GCRA's state holding u token-ms at now: arrival time and remainder, (0, 0) when empty.
  local function gcra_set(i, s, u)
    if u <= 0 then
      s.a, s.b = 0, 0
      return
    end
    local r = rate(i)
    local q = floor_div(u, r)
    s.a, s.b = now_ms + q, u - q * r
  end

  -- State of a non-log key, read once per call: the quantized log's buckets (sorted by start)
  -- and their total, or the a/b/c numbers of the other algorithms (fixed window: start, count;
  -- sliding counter: start, current, previous; GCRA: arrival time, remainder).
  local function load(i)
    local key = KEYS[i]
    local s = st[key]
    if s then
      return s
    end
    if algo[i] == 'q' then
      s = {list = {}, total = 0}
      local flat = redis.call('HGETALL', key)
      for j = 1, #flat, 2 do
        local b, c = tonumber(flat[j]), tonumber(flat[j + 1])
        s.list[#s.list + 1] = {b, c}
        s.total = s.total + c
      end
      table.sort(s.list, function(x, y) return x[1] < y[1] end)
    else
      s = {a = 0, b = 0, c = 0}
      local v = redis.call('GET', key)
      if v then
        s.a, s.b, s.c = read_o1(v, algo[i], wnd(i), rate(i))
      end
    end
    st[key] = s
    return s
  end

  local function settle(i, s)
    local a, w = algo[i], wnd(i)
    if a == 'q' then
      local span = window[i] + quantum(i)
      local dead = {}
      while s.list[1] and s.list[1][1] + span <= now_ms do
        local b = table.remove(s.list, 1)
        s.total = s.total - b[2]
        dead[#dead + 1] = fmt(b[1])
      end
      if #dead > 0 then
        redis.call('HDEL', KEYS[i], unpack(dead))
      end
    elseif a == 'f' then
      local start = math.floor(now_ms / w) * w
      if start > s.a then
        s.a = start
        s.b = 0
      end
    elseif a == 's' then
      local start = math.floor(now_ms / w) * w
      if start > s.a then
        if start == s.a + w then
          s.c = s.b
        else
          s.c = 0
        end
        s.b = 0
        s.a = start
      end
    else
      -- Only an emptied bucket changes: it forgets its arrival time.
      if gcra_used(s.a, s.b, rate(i), now_ms) == 0 then
        s.a, s.b = 0, 0
      end
    end
  end

  local function count(i, s)
    local a, w = algo[i], wnd(i)
    if a == 'q' then
      return s.total
    elseif a == 'f' then
      return s.b
    elseif a == 's' then
      local e = now_ms - s.a
      if e < 0 then
        e = 0
      end
      local left = w - e
      if left < 0 then
        left = 0
      end
      return s.b + math.ceil(s.c * left / w)
    else
      return ceil_div(gcra_used(s.a, s.b, rate(i), now_ms), w)
    end
  end

  local function reset(i, s)
    local a, w = algo[i], wnd(i)
    local r
    if a == 'q' then
      if not s.list[1] then
        return window[i]
      end
      r = s.list[1][1] + window[i] + quantum(i) - now_ms
    elseif a == 'f' or a == 's' then
      r = s.a + w - now_ms
    else
      local u = gcra_used(s.a, s.b, rate(i), now_ms)
      if u == 0 or limit[i] == 0 then
        return window[i]
      end
      local c = ceil_div(u, w)
      r = ceil_div(u - (c - 1) * w, limit[i])
    end
    if r < 0 then
      r = 0
    end
    return r
  end

  -- Records h hits; returns the undo token (see the reply).
  local function record(i, s, h)
    local a, w = algo[i], wnd(i)
    if a == 'q' then
      local q = quantum(i)
      local b = math.floor(now_ms / q) * q
      local last = s.list[#s.list]
      if last and last[1] >= b then
        b = last[1]
        last[2] = last[2] + h
      else
        s.list[#s.list + 1] = {b, h}
      end
      s.total = s.total + h
      redis.call('HINCRBY', KEYS[i], fmt(b), fmt(h))
      return b + 1
    elseif a == 'f' or a == 's' then
      s.b = s.b + h
      return s.a + 1
    else
      local u = gcra_used(s.a, s.b, rate(i), now_ms) + h * w
      if u > MAX_EXACT then
        u = MAX_EXACT
      end
      gcra_set(i, s, u)
      return rate(i)
    end
  end

  local function refund(i, s, h)
    local a, w = algo[i], wnd(i)
    if a == 'q' then
      while h > 0 and s.list[#s.list] do
        local last = s.list[#s.list]
        local take = math.min(last[2], h)
        last[2] = last[2] - take
        h = h - take
        s.total = s.total - take
        if last[2] == 0 then
          table.remove(s.list)
          redis.call('HDEL', KEYS[i], fmt(last[1]))
        else
          redis.call('HSET', KEYS[i], fmt(last[1]), fmt(last[2]))
        end
      end
    elseif a == 'f' then
      s.b = math.max(0, s.b - h)
    elseif a == 's' then
      local take = math.min(h, s.b)
      s.b = s.b - take
      s.c = math.max(0, s.c - (h - take))
    else
      local u, d = gcra_used(s.a, s.b, rate(i), now_ms), h * w
      if d >= u then
        u = 0
      else
        u = u - d
      end
      gcra_set(i, s, u)
    end
  end

  -- Stores a written non-log key with its TTL, or deletes it once empty.
  local function store(i, s)
    local key, a, w = KEYS[i], algo[i], wnd(i)
    local ttl
    if a == 'q' then
      local last = s.list[#s.list]
      if not last then
        redis.call('DEL', key)
        return
      end
      ttl = last[1] + window[i] + quantum(i) - now_ms
    elseif (a == 'g' and s.a == 0 and s.b == 0) or (a ~= 'g' and s.b == 0 and s.c == 0) then
      redis.call('DEL', key)
      return
    else
      local value
      if a == 's' then
        value = compose({s.b, s.c}, math.floor(s.a / w))
        ttl = s.a + 2 * w - now_ms
      elseif a == 'f' then
        value = compose({s.b}, math.floor(s.a / w))
        ttl = s.a + 2 * w - now_ms
      else
        value = compose({s.b}, s.a)
        ttl = ceil_div(gcra_used(s.a, s.b, rate(i), now_ms), rate(i)) + w
      end
      if ttl < 1 then
        ttl = 1
      end
      redis.call('SET', key, value, 'PX', fmt(ttl))
      return
    end
    if ttl < 1 then
      ttl = 1
    end
    redis.call('PEXPIRE', key, fmt(ttl))
  end

  o1_helpers = {
    load = load, settle = settle, count = count, reset = reset,
    record = record, refund = refund, store = store,
  }
  return o1_helpers
end

-- Decides the request whose slices are `keys` and `args` (one the lean log path declined, or
-- an unbatched call it was not tried on); returns its reply.
local function decide(keys, args)
KEYS, ARGV, n = keys, args, #keys
if #ARGV ~= 1 + 6 * n then
  return redis.error_reply('sluice: expected 1 + 6 * #KEYS arguments')
end
limit, window, hits, kind, algo, param, passed = {}, {}, {}, {}, {}, {}, {}
earlier = {}
any_quota, quota_passed = false, false
st = {}
lg = {}
admitted = 1

-- Phase 1: bring keys to now and check; nothing but expired entries is removed.
for i = 1, n do
  local key = KEYS[i]
  local a = 1 + (i - 1) * 6
  limit[i] = tonumber(ARGV[a + 1])
  window[i] = tonumber(ARGV[a + 2])
  hits[i] = tonumber(ARGV[a + 3])
  kind[i] = ARGV[a + 4]
  algo[i] = ARGV[a + 5]
  param[i] = tonumber(ARGV[a + 6])
  if not (limit[i] and window[i] and hits[i] and param[i]) then
    return redis.error_reply('sluice: bad number in item ' .. i)
  end
  if kind[i] ~= 'c' and kind[i] ~= 's' and kind[i] ~= 'r' and kind[i] ~= 'q' then
    return redis.error_reply('sluice: bad kind in item ' .. i)
  end
  local cap = limit[i]
  local seen
  if algo[i] == 'l' then
    local gone = redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms - window[i])
    local lk = lg[key]
    if not lk then
      lg[key] = {card = redis.call('ZCARD', key)}
    elseif gone > 0 then
      lg[key] = {card = lk.card - gone}
    end
    if kind[i] ~= 'r' then
      seen = lg[key].card
    end
  elseif algo[i] == 'q' or algo[i] == 's' or algo[i] == 'g' or algo[i] == 'f' then
    local h = o1()
    local s = h.load(i)
    h.settle(i, s)
    if kind[i] ~= 'r' then
      seen = h.count(i, s)
    end
    if algo[i] == 'g' then
      if limit[i] > 0 then
        cap = param[i]
      else
        cap = 0
      end
    end
  else
    return redis.error_reply('sluice: bad algorithm in item ' .. i)
  end
  if kind[i] == 'r' then
    passed[i] = true
  else
    seen = seen + (earlier[key] or 0)
    local ok
    if hits[i] == 0 then
      ok = seen < cap
    else
      ok = seen + hits[i] <= cap
    end
    passed[i] = ok
    if kind[i] == 'q' then
      any_quota = true
      if ok then
        quota_passed = true
      end
    end
    if kind[i] == 'c' then
      earlier[key] = (earlier[key] or 0) + hits[i]
      if not ok then
        admitted = 0
      end
    elseif ok then
      earlier[key] = (earlier[key] or 0) + hits[i]
    end
  end
end
-- quota_mode: an over-limit quota item fails the batch only when every quota item is over.
if any_quota and not quota_passed then
  admitted = 0
end

-- Phase 2: write, only for an admitted batch.
local first = {}
if admitted == 1 then
  -- A log key must not reach one of its live members (ZADD would update it instead of adding
  -- one); checked before anything is written. Needs ~7.4M live entries.
  local adding = {}
  for i = 1, n do
    if algo[i] == 'l' and hits[i] > 0 and (kind[i] == 'c' or (kind[i] ~= 'r' and passed[i])) then
      adding[KEYS[i]] = (adding[KEYS[i]] or 0) + hits[i]
      if log_span(KEYS[i]) + adding[KEYS[i]] > MEMBERS then
        return redis.error_reply('sluice: sliding log ' .. KEYS[i] .. ' is full (members wrap)')
      end
    end
  end
  local written, written_window = {}, {}
  local stored, stored_item = {}, {}
  for i = 1, n do
    local key = KEYS[i]
    local h = hits[i]
    local writes = h > 0 and (kind[i] == 'r' or kind[i] == 'c' or passed[i])
    if algo[i] ~= 'l' then
      if writes then
        if kind[i] == 'r' then
          o1().refund(i, st[key], h)
        else
          first[i] = o1().record(i, st[key], h)
        end
        if not stored_item[key] then
          stored[#stored + 1] = key
        end
        stored_item[key] = i
      end
    elseif writes then
      local wrote = false
      if kind[i] == 'r' then
        local lk = lg[key]
        if h > lk.card then
          h = lk.card
        end
        if h > 0 then
          redis.call('ZPOPMAX', key, fmt(h))
          lg[key] = {card = lk.card - h, old = lk.old}
          wrote = true
        end
      else
        first[i] = add(key, h)
        wrote = true
      end
      if wrote and not written_window[key] then
        written[#written + 1] = key
        written_window[key] = window[i]
      end
    end
  end
  for _, key in ipairs(written) do
    local top = log_top(key)
    if top then
      local ttl = top[2] + written_window[key] - now_ms
      if ttl < 1 then
        ttl = 1
      end
      redis.call('PEXPIRE', key, fmt(ttl))
    end
  end
  for _, key in ipairs(stored) do
    o1().store(stored_item[key], st[key])
  end
end

-- Outcomes after the decision.
local reply = {admitted}
local seen_key = {}
for i = 1, n do
  local key = KEYS[i]
  local c, reset_ms
  if algo[i] == 'l' then
    local sk = seen_key[key]
    if not sk then
      local old = log_old(key)
      sk = {lg[key].card, old and old[2]}
      seen_key[key] = sk
    end
    c = sk[1]
    reset_ms = window[i]
    if sk[2] then
      reset_ms = sk[2] + window[i] - now_ms
      if reset_ms < 0 then
        reset_ms = 0
      end
    end
  else
    c = o1().count(i, st[key])
    reset_ms = o1().reset(i, st[key])
  end
  reply[#reply + 1] = passed[i] and 1 or 0
  reply[#reply + 1] = c
  reply[#reply + 1] = reset_ms
end
for i = 1, n do
  reply[#reply + 1] = first[i] or 0
end
return reply
end

if not batched then
  return decide(CALL_KEYS, CALL_ARGV)
end
-- Several requests in one call, decided one after the other as if each had its own call.
local groups = tonumber(CALL_ARGV[3])
if not groups or groups < 1 or #CALL_ARGV < 3 + groups then
  return redis.error_reply('sluice: bad group count')
end
local sizes, total = {}, 0
for g = 1, groups do
  sizes[g] = tonumber(CALL_ARGV[3 + g])
  if not sizes[g] or sizes[g] < 0 then
    return redis.error_reply('sluice: bad size of group ' .. g)
  end
  total = total + sizes[g]
end
if #CALL_KEYS ~= total or #CALL_ARGV ~= 3 + groups + 6 * total then
  return redis.error_reply('sluice: group sizes do not match KEYS and ARGV')
end
local replies = {}
local k, a = 0, 3 + groups
for g = 1, groups do
  n = sizes[g]
  local reply = decide_log(k, a)
  if not reply then
    local keys, args = {}, {clock}
    for j = 1, sizes[g] do
      keys[j] = CALL_KEYS[k + j]
    end
    for j = 1, 6 * sizes[g] do
      args[1 + j] = CALL_ARGV[a + j]
    end
    reply = decide(keys, args)
  end
  replies[g] = reply
  k = k + sizes[g]
  a = a + 6 * sizes[g]
end
return replies
"#
);

/// Undoes exactly what earlier [`SCRIPT`] calls recorded. KEYS = keys; ARGV per key:
/// `algorithm` code, `undo` (from that call's reply, non-zero), `hits`, `window_ms`.
/// - log: removes the `hits` members from the token's first member on (cyclically), each only if
///   its score still matches the token's (`score mod 2^30`, or one more for members after a
///   wrap; `ZMSCORE`, Redis 6.2 or later): a refund may have popped them and another request may
///   have reused the numbers since, at a later ms, and those entries stay. Only a pop and reuse
///   within the same ms is indistinguishable (then another request's entries go instead of the
///   popped ones: the count is as low as if the refund had taken those);
/// - quantized log: takes `hits` from the bucket `undo - 1` (deleting it at zero);
/// - fixed window / sliding counter: takes `hits` from the window that started at `undo - 1`,
///   i.e. the current count, or the previous one if the counter rotated since (nothing when the
///   window is gone);
/// - GCRA: takes `hits × window_ms` token-ms off the arrival time (`undo` = the rate it was
///   counted in). Exact also after other writes in between, unless the bucket emptied between
///   the write and the compensation (then up to that interval × rate tokens too few).
///
/// Counts never go below zero (a refund may have taken them meanwhile). Reply: the hits taken
/// back (for the log, the members removed).
pub const COMPENSATE: &str = concat!(
    lua_prelude!(),
    r#"
local removed = 0
if #ARGV ~= 4 * #KEYS then
  return redis.error_reply('sluice: expected 4 * #KEYS arguments')
end

for i = 1, #KEYS do
  local key = KEYS[i]
  local a = ARGV[4 * i - 3]
  local token = tonumber(ARGV[4 * i - 2])
  local hits = tonumber(ARGV[4 * i - 1])
  local w = tonumber(ARGV[4 * i])
  if not (token and hits and w) then
    return redis.error_reply('sluice: bad number in item ' .. i)
  end
  if w < 1 then
    w = 1
  end
  if a == 'l' then
    -- token - 1 = (score mod 2^30) * 2^23 + (first member - MEMBER_LO); members after a wrap
    -- went 1 ms later. A member whose score does not match is someone else's entry that reused
    -- the number after a refund popped ours: it stays.
    local off = token - 1
    local m0 = MEMBER_LO + off % TOKEN_MEMBER
    local s0 = math.floor(off / TOKEN_MEMBER)
    if hits > MEMBERS then
      hits = MEMBERS
    end
    local j = 0
    while j < hits do
      local args, later = {}, {}
      local m = 0
      while m < CHUNK and j < hits do
        m = m + 1
        local member = m0 + j
        later[m] = member > MEMBER_HI
        if later[m] then
          member = member - MEMBERS
        end
        args[m] = fmt(member)
        j = j + 1
      end
      local scores = redis.call('ZMSCORE', key, unpack(args))
      local mine = {}
      for x = 1, m do
        local sc = tonumber(scores[x])
        if sc then
          local k = math.floor(sc) % TOKEN_SCORE
          if k == s0 or (later[x] and k == (s0 + 1) % TOKEN_SCORE) then
            mine[#mine + 1] = args[x]
          end
        end
      end
      if #mine > 0 then
        removed = removed + redis.call('ZREM', key, unpack(mine))
      end
    end
  elseif a == 'q' then
    local field = fmt(token - 1)
    local have = tonumber(redis.call('HGET', key, field) or '0') or 0
    local take = math.min(have, hits)
    if take >= have then
      redis.call('HDEL', key, field)
    elseif take > 0 then
      redis.call('HINCRBY', key, field, fmt(-take))
    end
    removed = removed + take
  else
    local v = redis.call('GET', key)
    if v then
      -- GCRA's token is its rate (token-ms per ms), which its arrival time is counted in.
      local r = 1
      if a == 'g' and token >= 1 then
        r = token
      end
      local sa, sb, sc = read_o1(v, a, w, r)
      if a == 'g' then
        -- Take hits × w token-ms off the arrival time: exact, whatever the clock says now.
        local d = hits * w
        local gone = d > MAX_EXACT
        if not gone then
          local q = floor_div(d, r)
          sa, sb = sa - q, sb - (d - q * r)
          if sb < 0 then
            sa, sb = sa - 1, sb + r
          end
          gone = sa < 0 or (sa == 0 and sb == 0)
        end
        removed = removed + hits
        if gone then
          redis.call('DEL', key)
        else
          redis.call('SET', key, compose({sb}, sa), 'KEEPTTL')
        end
      else
        local b0, c0 = sb, sc
        if sa == token - 1 then
          sb = math.max(0, sb - hits)
        elseif a == 's' and sa == token - 1 + w then
          sc = math.max(0, sc - hits)
        end
        removed = removed + (b0 - sb) + (c0 - sc)
        if sb == 0 and sc == 0 then
          redis.call('DEL', key)
        elseif a == 's' then
          redis.call('SET', key, compose({sb, sc}, math.floor(sa / w)), 'KEEPTTL')
        else
          redis.call('SET', key, compose({sb}, math.floor(sa / w)), 'KEEPTTL')
        end
      end
    end
  end
end
return removed
"#
);

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
            Value::ServerError(e) => Err(LimiterError::Protocol(format!("script refused: {e}"))),
            other => decode_reply(other, items),
        })
        .collect())
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
mod tests {
    use super::*;

    fn ints(v: &[i64]) -> Value {
        Value::Array(v.iter().map(|&n| Value::Int(n)).collect())
    }

    #[test]
    fn decodes_a_two_item_reply() {
        let out = decode_reply(&ints(&[0, 1, 3, 250, 0, 5, 1000, 0, 0]), 2).expect("valid reply");
        assert_eq!(
            out,
            BatchOutcome {
                admitted: false,
                items: vec![
                    KeyOutcome {
                        passed: true,
                        count: 3,
                        reset_ms: 250
                    },
                    KeyOutcome {
                        passed: false,
                        count: 5,
                        reset_ms: 1000
                    },
                ],
                answered_by: crate::limiter::AnsweredBy::Backend,
            }
        );
    }

    #[test]
    fn decodes_an_empty_batch() {
        let out = decode_reply(&ints(&[1]), 0).expect("valid reply");
        assert!(out.admitted);
        assert!(out.items.is_empty());
    }

    #[test]
    fn decodes_batched_replies_per_group() {
        // A group the script refused arrives as an error inside the array, as Redis sends it.
        let refused = redis::parse_redis_value(b"-ERR sluice: bad kind in item 1\r\n")
            .expect("an error reply parses");
        assert!(matches!(refused, Value::ServerError(_)), "{refused:?}");
        let reply = Value::Array(vec![
            ints(&[1, 1, 1, 999, 7]),
            ints(&[0, 0, 2, 500, 1, 3, 40, 0, 0]),
            refused,
        ]);
        let groups = decode_batched_reply(&reply, &[1, 2, 0]).expect("valid batched reply");
        assert_eq!(groups.len(), 3);
        let first = groups[0].as_ref().expect("group 1");
        assert!(first.admitted);
        assert_eq!(first.items[0].count, 1);
        let second = groups[1].as_ref().expect("group 2");
        assert!(!second.admitted);
        assert_eq!(second.items[1].reset_ms, 40);
        assert!(matches!(groups[2], Err(LimiterError::Protocol(_))));
        // A group whose size does not match its reply fails alone.
        let groups = decode_batched_reply(&reply, &[2, 2, 0]).expect("outer shape is fine");
        assert!(groups[0].is_err() && groups[1].is_ok());
        assert!(decode_batched_reply(&reply, &[1, 2]).is_err());
        assert!(decode_batched_reply(&Value::Nil, &[1]).is_err());
    }

    #[test]
    fn rejects_malformed_replies() {
        let bad = [
            (Value::Nil, 0),
            (Value::Int(1), 0),
            (ints(&[1, 1, 0]), 1),
            (ints(&[1, 1, 0, 0]), 1),
            (ints(&[1, 1, 0, 0, 9, 9]), 1),
            (ints(&[2, 1, 0, 0, 0]), 1),
            (ints(&[1, 7, 0, 0, 0]), 1),
            (ints(&[1, 1, -1, 0, 0]), 1),
            (ints(&[1, 1, 1, 0, -5]), 1),
            (
                Value::Array(vec![
                    Value::Int(1),
                    Value::BulkString(b"1".to_vec()),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                ]),
                1,
            ),
        ];
        for (value, items) in bad {
            match decode_reply(&value, items) {
                Err(LimiterError::Protocol(_)) => {}
                other => panic!("{value:?} decoded to {other:?}"),
            }
        }
    }
}
