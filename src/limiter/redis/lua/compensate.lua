-- Takes back exactly what earlier decide.lua calls recorded (the cluster backend's compensation
-- when one slot of a request rejected). KEYS, ARGV and the reply: the doc of `COMPENSATE` in
-- src/limiter/redis/script.rs; the layout header and shared.lua come first.
--
-- Counts never go below zero: a refund may have taken hits back meanwhile.

-- The clock the decisions were made on (the first argument, as decide.lua reads it): log
-- entries are found again near it.
start_call()
now_ms = read_clock(ARGV[1])
if not now_ms then
  return redis.error_reply('sluice: bad now')
end

-- Removes the log entry of undo token `token` (see decide.lua), which recorded `hits`: the
-- entry with the token's number at the token's score (the time congruent to it modulo
-- TOKEN_SCORE that is nearest to the clock), if it still weighs at most `hits` (a refund may
-- have taken part of it since). A refund may have removed it and another request reused the
-- number since, at a later ms, and that entry stays; only a removal and reuse within the same ms
-- is indistinguishable (then the other request's entry goes instead, if it is not heavier: the
-- count is as low as if the refund had taken it). Returns the weight removed.
local function undo_log(key, token, hits)
  local offset = token - 1
  local number = LOG_MEMBER_FIRST + offset % TOKEN_MEMBER
  local score = math.floor(offset / TOKEN_MEMBER) + now_ms - now_ms % TOKEN_SCORE
  if score > now_ms + TOKEN_SCORE / 2 then
    score = score - TOKEN_SCORE
  elseif score < now_ms - TOKEN_SCORE / 2 then
    score = score + TOKEN_SCORE
  end
  local at = redis.call('ZRANGE', key, format_integer(score), format_integer(score), 'BYSCORE')
  for j = 1, #at do
    local found, weight = parse_log_member(at[j])
    if found == number and weight <= hits then
      redis.call('ZREM', key, at[j])
      local total = redis.call('ZSCORE', key, LOG_TOTAL_MEMBER)
      store_log_total(key, math.max(-(total or 0) - weight, 0))
      return weight
    end
  end
  return 0
end

-- Takes `hits` from the quantized log's bucket that started at `token - 1`, deleting it at zero.
local function undo_buckets(key, token, hits)
  local field = format_number(token - 1)
  local held = tonumber(redis.call('HGET', key, field) or '0') or 0
  local take = math.min(held, hits)
  if take >= held then
    redis.call('HDEL', key, field)
  elseif take > 0 then
    redis.call('HINCRBY', key, field, format_number(-take))
  end
  return take
end

-- Takes `hits * window` token-ms off GCRA's arrival time, counted at the rate `token` the hits
-- were recorded at: exact also after other writes in between, unless the bucket emptied between
-- the write and the compensation (then up to that interval times the rate too few).
local function undo_gcra(key, token, hits, window)
  local value = redis.call('GET', key)
  if not value then
    return 0
  end
  local rate = math.max(token, 1)
  local remainder, _, arrival = decode_value(value, 1)
  local token_ms = hits * window
  local empty = token_ms > MAX_EXACT
  if not empty then
    local whole = floor_div(token_ms, rate)
    arrival, remainder = arrival - whole, remainder - (token_ms - whole * rate)
    if remainder < 0 then
      arrival, remainder = arrival - 1, remainder + rate
    end
    empty = arrival < 0 or (arrival == 0 and remainder == 0)
  end
  if empty then
    redis.call('DEL', key)
  else
    redis.call('SET', key, encode_value(arrival, remainder), 'KEEPTTL')
  end
  return hits
end

-- Takes `hits` from the fixed window or sliding counter window that started at `token - 1`: the
-- current count, or the previous one if the counter rotated since (nothing once it is gone).
local function undo_window(key, algorithm, token, hits, window)
  local value = redis.call('GET', key)
  if not value then
    return 0
  end
  local counts = 1
  if algorithm == ALGORITHM_SLIDING_COUNTER then
    counts = 2
  end
  local current, previous, index = decode_value(value, counts)
  local start = index * window
  local before = current + previous
  if start == token - 1 then
    current = math.max(current - hits, 0)
  elseif counts == 2 and start == token - 1 + window then
    previous = math.max(previous - hits, 0)
  end
  if current == 0 and previous == 0 then
    redis.call('DEL', key)
  elseif counts == 2 then
    redis.call('SET', key, encode_value(index, current, previous), 'KEEPTTL')
  else
    redis.call('SET', key, encode_value(index, current), 'KEEPTTL')
  end
  return before - current - previous
end

if #ARGV ~= 1 + UNDO_ARGS_PER_KEY * #KEYS then
  return redis.error_reply('sluice: expected 1 + ' .. UNDO_ARGS_PER_KEY .. ' * #KEYS arguments')
end
local undo = {}
for i = 1, #KEYS do
  local at = 1 + UNDO_ARGS_PER_KEY * (i - 1)
  local entry = {
    algorithm = ARGV[at + UNDO_ARG_ALGORITHM],
    token = tonumber(ARGV[at + UNDO_ARG_TOKEN]),
    hits = tonumber(ARGV[at + UNDO_ARG_HITS]),
    window = tonumber(ARGV[at + UNDO_ARG_WINDOW_MS]),
  }
  if not (entry.token and entry.hits and entry.window) then
    return redis.error_reply('sluice: bad number in item ' .. i)
  end
  local algorithm = entry.algorithm
  if algorithm ~= ALGORITHM_SLIDING_LOG and algorithm ~= ALGORITHM_QUANTIZED_LOG
      and algorithm ~= ALGORITHM_SLIDING_COUNTER and algorithm ~= ALGORITHM_GCRA
      and algorithm ~= ALGORITHM_FIXED_WINDOW and algorithm ~= ALGORITHM_IN_FLIGHT then
    return redis.error_reply('sluice: bad algorithm in item ' .. i)
  end
  entry.window = math.max(entry.window, 1)
  undo[i] = entry
end

local removed = 0
for i = 1, #KEYS do
  local key, entry = KEYS[i], undo[i]
  local algorithm, token, hits = entry.algorithm, entry.token, entry.hits
  if algorithm == ALGORITHM_SLIDING_LOG then
    removed = removed + undo_log(key, token, hits)
  elseif algorithm == ALGORITHM_QUANTIZED_LOG then
    removed = removed + undo_buckets(key, token, hits)
  elseif algorithm == ALGORITHM_GCRA then
    removed = removed + undo_gcra(key, token, hits, entry.window)
  elseif algorithm == ALGORITHM_IN_FLIGHT then
    -- The lease the request added (token - 1), if no refund released it since; the key goes
    -- with its last member.
    removed = removed + redis.call('ZREM', key, format_integer(token - 1))
  else
    removed = removed + undo_window(key, algorithm, token, hits, entry.window)
  end
end
return removed
