-- The reference of scripts/bench/script-cost.sh: a minimal hand-written weighted sliding log,
-- what one would write to decide one item of `hits` in a single script call, with nothing
-- sluice adds (no argument checks, no reset time, no undo token, no batching, no other
-- algorithm). One sorted set per key: an entry per call that recorded, scored with its ms and
-- named `ms:total:weight` (unique: the total only grows between two entries of the same ms),
-- and the member `t` holding the total, negated. Steps: TIME, evict what left the window and
-- subtract its weight, add the entry and the total, PEXPIRE.
--
-- KEYS[1]: the key. ARGV as sluice's script takes one item (ARGV[1] the clock, ignored: always
-- TIME), of which it reads the limit, the window in ms and the hits (ARGV[2], ARGV[3], ARGV[4]).
-- Reply: {admitted (0 or 1), the total after the call}.
local key = KEYS[1]
local limit, window, hits = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local time = redis.call('TIME')
local now = time[1] * 1000 + math.floor(time[2] / 1000)
local cutoff = now - window
local total = -(tonumber(redis.call('ZSCORE', key, 't')) or 0)
local gone = redis.call('ZRANGE', key, 0, cutoff, 'BYSCORE')
if #gone > 0 then
  for i = 1, #gone do
    total = total - tonumber(string.match(gone[i], ':(%d+)$'))
  end
  redis.call('ZREMRANGEBYSCORE', key, 0, cutoff)
end
if total + hits > limit then
  if #gone > 0 then
    if total > 0 then
      redis.call('ZADD', key, -total, 't')
    else
      redis.call('DEL', key)
    end
  end
  return {0, total}
end
total = total + hits
redis.call('ZADD', key, -total, 't', now, now .. ':' .. total .. ':' .. hits)
redis.call('PEXPIRE', key, window)
return {1, total}
