//! The Lua script that decides one batch atomically inside Redis, and the pure decoding of its
//! reply.
//!
//! Why a script: the decision must read every key of the batch, check them all and then write
//! all or nothing. One `EVALSHA` with every key in `KEYS` runs atomically on the server, in one
//! round trip, so concurrent sidecars can never interleave between check and record. The steps
//! are a transcription of [`crate::limiter::window::decide_batch`], which is the reference.

use crate::limiter::{BatchOutcome, KeyOutcome, LimiterError};
use redis::Value;

/// Arguments per batch item after `ARGV[1]`.
pub const ARGS_PER_ITEM: usize = 4;

/// Largest number sent to the script. Lua numbers are doubles, exact up to 2^53; capping every
/// input at 2^52 keeps sums of two of them exact. Limits are capped at `MAX_EXACT - 1` (no real
/// limit is near it, and Redis could not hold that many members anyway), so a capped `hits`
/// still exceeds every limit, exactly like the original value.
pub const MAX_EXACT: u64 = 1 << 52;

/// Kind codes in `ARGV`.
pub const KIND_CONSUME: &str = "c";
pub const KIND_SHADOW: &str = "s";
pub const KIND_REFUND: &str = "r";

/// KEYS: one per batch item, in batch order (a key may repeat; repeats are cumulative).
///
/// ARGV:
/// - `ARGV[1]`: `now` in ms, or the empty string to read Redis `TIME` (production: every sidecar
///   then uses the same clock, however skewed their hosts are). An explicit `now` is for tests.
/// - then per item `i` (1-based), at `ARGV[2 + 4(i-1)] ..`: `limit`, `window_ms`, `hits`, `kind`
///   (`c` consume, `s` shadow, `r` refund). Decimal integers, each at most [`MAX_EXACT`] (limits
///   at most `MAX_EXACT - 1`).
///
/// Reply: a flat array of integers, `1 + 4n` long:
/// `{admitted, passed_1, count_1, reset_ms_1, ..., passed_n, count_n, reset_ms_n, first_1, ...,
/// first_n}` with `admitted`/`passed` 0 or 1, `count` the key's entries after the decision,
/// `reset_ms` the ms until its oldest entry leaves the window (`window_ms` when empty) and
/// `first` the first member this item added (it added `hits` consecutive integers from there), 0
/// when it added nothing. The added ranges let the cluster backend undo exactly this call's
/// entries when another slot's part of the request was rejected ([`COMPENSATE`]). Malformed
/// arguments give an error reply starting with `sluice:`.
///
/// Data layout: each key is a sorted set with one member per hit; score = the ms it was recorded.
/// - Phase 1, per item in order: `ZREMRANGEBYSCORE key -inf (now - window)` (an entry at `t`
///   counts while `now - t < window`), then consume/shadow check `ZCARD + earlier + hits <= limit`
///   (`< limit` for a `hits = 0` probe), `earlier` being the hits earlier items of the batch would
///   record on the same key (consume always, shadow only if it passed).
/// - Phase 2, only if every consume item passed, in batch order: consume and passed shadow items
///   with `hits > 0` add `hits` members; refunds `ZPOPMAX` up to `hits` members; then each written
///   key gets `PEXPIRE` = time until its newest entry leaves the window, so idle keys vanish on
///   their own and never outlive their window. A rejected batch writes nothing and leaves TTLs.
///
/// Members must be unique per key and short. They are integers, which a listpack stores in a few
/// bytes (a UUID would cost 36): `member = max(1e15 + now_us, top_member + 1)`, then +1 per hit,
/// with `now_us` the microsecond `TIME` (or `now * 1000` with an explicit now) and `top` the last
/// element (`ZRANGE key -1 -1 WITHSCORES`). Scores are kept non-decreasing the same way:
/// `score = max(now_ms, top_score)`. Why this is safe across instances and clock steps:
/// - members strictly increase per key whatever any clock does, so they never collide (a
///   collision would silently update an existing member instead of adding one);
/// - the 1e15 offset makes every member exactly 16 digits (until the year 2255, also with the
///   small explicit clocks of tests), so Redis's lexicographic tie-break between equal scores
///   equals numeric order, and with non-decreasing scores the top element is always the last one
///   added: `ZPOPMAX` then removes the newest entries, and the next member is derived correctly;
/// - a score never goes back in time, so a step back of the clock cannot make a new entry expire
///   earlier than the one before it (the memory backend records at `max(now, newest)` too);
/// - members stay below 2^53, so Lua computes them exactly; `string.format('%.0f')` prints them
///   (`tostring` would switch to exponent notation).
///
/// Members go in `ZADD` chunks of at most 1000 (2000 arguments), far below Lua's `unpack` limit.
pub const SCRIPT: &str = r#"
local CHUNK = 1000
local MEMBER_BASE = 1e15

local function fmt(x)
  return string.format('%.0f', x)
end

local n = #KEYS
if #ARGV ~= 1 + 4 * n then
  return redis.error_reply('sluice: expected 1 + 4 * #KEYS arguments')
end

local now_ms, now_us
if ARGV[1] == '' then
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  now_ms = s * 1000 + math.floor(us / 1000)
  now_us = s * 1000000 + us
else
  now_ms = tonumber(ARGV[1])
  if not now_ms then
    return redis.error_reply('sluice: bad now')
  end
  now_us = now_ms * 1000
end

local limit, window, hits, kind, passed = {}, {}, {}, {}, {}
local earlier = {}
local admitted = 1

-- Phase 1: evict and check; nothing but expired entries is removed.
for i = 1, n do
  local key = KEYS[i]
  local a = 1 + (i - 1) * 4
  limit[i] = tonumber(ARGV[a + 1])
  window[i] = tonumber(ARGV[a + 2])
  hits[i] = tonumber(ARGV[a + 3])
  kind[i] = ARGV[a + 4]
  if not (limit[i] and window[i] and hits[i]) then
    return redis.error_reply('sluice: bad number in item ' .. i)
  end
  if kind[i] ~= 'c' and kind[i] ~= 's' and kind[i] ~= 'r' then
    return redis.error_reply('sluice: bad kind in item ' .. i)
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now_ms - window[i]))
  if kind[i] == 'r' then
    passed[i] = true
  else
    local seen = redis.call('ZCARD', key) + (earlier[key] or 0)
    local ok
    if hits[i] == 0 then
      ok = seen < limit[i]
    else
      ok = seen + hits[i] <= limit[i]
    end
    passed[i] = ok
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

local function add(key, h)
  local score, member = now_ms, MEMBER_BASE + now_us
  local first
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[1] then
    local tm, ts = tonumber(top[1]), tonumber(top[2])
    if tm and tm + 1 > member then
      member = tm + 1
    end
    if ts and ts > score then
      score = ts
    end
  end
  local s = fmt(score)
  first = member
  while h > 0 do
    local m = h
    if m > CHUNK then
      m = CHUNK
    end
    local args = {}
    for j = 1, m do
      args[2 * j - 1] = s
      args[2 * j] = fmt(member)
      member = member + 1
    end
    redis.call('ZADD', key, unpack(args))
    h = h - m
  end
  return first
end

-- Phase 2: write, only for an admitted batch.
local first = {}
if admitted == 1 then
  local written, written_window = {}, {}
  for i = 1, n do
    local key = KEYS[i]
    local h = hits[i]
    local wrote = false
    if h > 0 then
      if kind[i] == 'r' then
        local size = redis.call('ZCARD', key)
        if h > size then
          h = size
        end
        if h > 0 then
          redis.call('ZPOPMAX', key, fmt(h))
          wrote = true
        end
      elseif kind[i] == 'c' or passed[i] then
        first[i] = add(key, h)
        wrote = true
      end
    end
    if wrote and not written_window[key] then
      written[#written + 1] = key
      written_window[key] = window[i]
    end
  end
  for _, key in ipairs(written) do
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if top[2] then
      local ttl = tonumber(top[2]) + written_window[key] - now_ms
      if ttl < 1 then
        ttl = 1
      end
      redis.call('PEXPIRE', key, fmt(ttl))
    end
  end
end

-- Outcomes after the decision.
local reply = {admitted}
local seen_key = {}
for i = 1, n do
  local key = KEYS[i]
  local st = seen_key[key]
  if not st then
    local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    st = {redis.call('ZCARD', key), tonumber(oldest[2])}
    seen_key[key] = st
  end
  local reset = window[i]
  if st[2] then
    reset = st[2] + window[i] - now_ms
    if reset < 0 then
      reset = 0
    end
  end
  reply[#reply + 1] = passed[i] and 1 or 0
  reply[#reply + 1] = st[1]
  reply[#reply + 1] = reset
end
for i = 1, n do
  reply[#reply + 1] = first[i] or 0
end
return reply
"#;

/// Undoes exactly what earlier [`SCRIPT`] calls added: KEYS = keys, ARGV = per key `first`,
/// `hits` (the member range `first ..= first + hits - 1` from that call's reply). Members are
/// unique per key and never reused, so this removes those entries and nothing else, even after
/// other requests added theirs. Reply: the number of members removed.
pub const COMPENSATE: &str = r#"
local CHUNK = 1000
local removed = 0
if #ARGV ~= 2 * #KEYS then
  return redis.error_reply('sluice: expected 2 * #KEYS arguments')
end
for i = 1, #KEYS do
  local first = tonumber(ARGV[2 * i - 1])
  local hits = tonumber(ARGV[2 * i])
  if not (first and hits) then
    return redis.error_reply('sluice: bad number in item ' .. i)
  end
  local j = 0
  while j < hits do
    local args = {}
    local m = 0
    while m < CHUNK and j < hits do
      m = m + 1
      args[m] = string.format('%.0f', first + j)
      j = j + 1
    end
    removed = removed + redis.call('ZREM', KEYS[i], unpack(args))
  end
end
return removed
"#;

/// Decodes the script's reply for a batch of `items` items (layout documented on [`SCRIPT`]).
pub fn decode_reply(value: &Value, items: usize) -> Result<BatchOutcome, LimiterError> {
    decode_reply_with_added(value, items).map(|(outcome, _)| outcome)
}

/// Like [`decode_reply`], also returning each item's first added member (0: added nothing).
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
    Ok((BatchOutcome { admitted, items }, added))
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
