-- The models of every algorithm but the sliding log: the script loads a key's state into Lua,
-- changes it as src/limiter/algorithms.rs does (the reference; the function names are its
-- methods'), and stores it back. Comes after the generated header and shared.lua, before
-- decide.lua, which makes the models once, when Redis loads the library.
--
-- Data layout (MEMORY USAGE measured in docs/algorithms.md):
-- - quantized log: a hash `bucket start (ms) -> hits`; hits go to the bucket
--   max(floor(now / quantum) * quantum, newest bucket). TTL: until the newest bucket leaves;
-- - the O(1) algorithms: one value (encode_value in shared.lua), written with `SET .. PX`:
--   - fixed window: its count; time = the window index start / window. TTL: two windows from
--     its start (`sluice:{edge|user=u10|60000|fw}` holding 12 hits is `21228333334`);
--   - sliding counter: the current and the previous window's counts; time = the window index.
--     TTL: two windows from its start;
--   - GCRA: remainder r; time = the theoretical arrival time T (ms). The tokens in use, times
--     the window, in integer token-ms (the refill is exactly rate = max(limit, 1) token-ms per
--     ms) are max(0, (T - now) * rate + r) with 0 <= r < rate, capped at MAX_EXACT; (0, 0) is
--     empty (the key is deleted). Recording h hits adds h * window token-ms to what is in use
--     at now and re-derives T = now + floor(used / rate), r = used mod rate; a refund takes
--     them off the same way. A clock that lags sees more tokens in use (conservative). At
--     limits up to 100,000 the value stays an integer. TTL: until empty, plus one window.
-- - in_flight: a sorted set of leases, member the lease token (decimal), score the ms it was
--   recorded at, max(now, newest); a lease counts while now - score < lease (the item's window),
--   so the count is the set's size once what expired is removed (settle, once per key and
--   request). Recording a token that holds a lease renews it (ZADD moves its score); a refund
--   removes its token's member and no other. TTL: until the newest lease expires, plus one
--   lease; an emptied key is deleted.
-- TTLs outlive the state by about a window, so that a lagging clock finds the same state the
-- memory backend keeps; an emptied key is deleted.

-- The models at the call's clock (now_ms, shared.lua): load, settle, count, reset_ms, record,
-- refund and store, each taking an item and its key's state (see decide.lua).
local function make_models()
  -- ceil(a / b) for integers below 2^53, exact whatever the rounding of the division; 0 unless
  -- both are positive.
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

  local function window_of(item)
    return math.max(item.window, 1)
  end

  local function quantum_of(item)
    return math.max(item.param, 1)
  end

  -- GCRA's refill in token-ms per ms (a limit of 0 refills like 1; its capacity is 0 anyway).
  local function rate_of(item)
    return math.max(item.limit, 1)
  end

  -- GCRA: token-ms in use at now (at most MAX_EXACT).
  local function gcra_used(item, state)
    local arrival, remainder, rate = state.arrival, state.remainder, rate_of(item)
    if arrival >= now_ms then
      return math.min((arrival - now_ms) * rate + remainder, MAX_EXACT)
    end
    local refilled = (now_ms - arrival) * rate
    if refilled >= remainder then
      return 0
    end
    return remainder - refilled
  end

  -- GCRA: the state that holds `used` token-ms at now; (0, 0) when empty.
  local function gcra_hold(item, state, used)
    if used <= 0 then
      state.arrival, state.remainder = 0, 0
      return
    end
    local rate = rate_of(item)
    local whole = floor_div(used, rate)
    state.arrival, state.remainder = now_ms + whole, used - whole * rate
  end

  -- Reads a key's state, once per request.
  local function load(item, state)
    local algorithm = item.algorithm
    if algorithm == ALGORITHM_IN_FLIGHT then
      -- Read by settle, which removes what expired first.
      return
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      -- Buckets {start, hits} sorted by start, and their total.
      local buckets, total = {}, 0
      local flat = redis.call('HGETALL', item.key)
      for j = 1, #flat, 2 do
        local start, hits = tonumber(flat[j]), tonumber(flat[j + 1])
        buckets[#buckets + 1] = {start, hits}
        total = total + hits
      end
      table.sort(buckets, function(x, y) return x[1] < y[1] end)
      state.buckets, state.total = buckets, total
      return
    end
    local value = redis.call('GET', item.key)
    if algorithm == ALGORITHM_GCRA then
      state.arrival, state.remainder = 0, 0
      if value then
        local remainder, _, arrival = decode_value(value, 1)
        state.arrival, state.remainder = arrival, remainder
      end
      return
    end
    -- Fixed window (count) or sliding counter (current and previous count), by window start.
    state.start, state.current, state.previous = 0, 0, 0
    if value then
      local counts = 1
      if algorithm == ALGORITHM_SLIDING_COUNTER then
        counts = 2
      end
      local current, previous, index = decode_value(value, counts)
      state.start, state.current, state.previous = index * window_of(item), current, previous
    end
  end

  -- in_flight: the score of the key's oldest ('0') or newest ('-1') lease, nil when none.
  local function lease_score(key, at)
    local lease = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
    if lease[2] then
      return lease[2] + 0
    end
    return nil
  end

  -- Brings the state to now: evict, rotate, decay (State::settle).
  local function settle(item, state)
    local algorithm = item.algorithm
    if algorithm == ALGORITHM_IN_FLIGHT then
      -- Expired leases leave, once per key and request (the items of a key share its lease).
      if not state.count then
        redis.call('ZREMRANGEBYSCORE', item.key, '-inf', format_integer(now_ms - item.window))
        state.count = redis.call('ZCARD', item.key)
      end
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      local span = item.window + quantum_of(item)
      local expired = {}
      while state.buckets[1] and state.buckets[1][1] + span <= now_ms do
        local bucket = table.remove(state.buckets, 1)
        state.total = state.total - bucket[2]
        expired[#expired + 1] = format_number(bucket[1])
      end
      if #expired > 0 then
        redis.call('HDEL', item.key, unpack(expired))
      end
    elseif algorithm == ALGORITHM_GCRA then
      -- Only an emptied bucket changes: it forgets its arrival time.
      if gcra_used(item, state) == 0 then
        state.arrival, state.remainder = 0, 0
      end
    else
      local window = window_of(item)
      local start = math.floor(now_ms / window) * window
      if start > state.start then
        if algorithm == ALGORITHM_SLIDING_COUNTER and start == state.start + window then
          state.previous = state.current
        else
          state.previous = 0
        end
        state.start, state.current = start, 0
      end
    end
  end

  -- What counts against the capacity (State::count).
  local function count(item, state)
    local algorithm = item.algorithm
    if algorithm == ALGORITHM_IN_FLIGHT then
      return state.count
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      return state.total
    elseif algorithm == ALGORITHM_GCRA then
      return ceil_div(gcra_used(item, state), window_of(item))
    elseif algorithm == ALGORITHM_SLIDING_COUNTER then
      -- The same IEEE-754 double expression as the Rust model's, so both round identically.
      local window = window_of(item)
      local left = math.max(window - math.max(now_ms - state.start, 0), 0)
      return state.current + math.ceil(state.previous * left / window)
    end
    return state.current
  end

  -- Milliseconds until the count drops (State::reset_ms).
  local function reset_ms(item, state)
    local algorithm = item.algorithm
    local reset
    if algorithm == ALGORITHM_IN_FLIGHT then
      local oldest = state.count > 0 and lease_score(item.key, '0')
      if not oldest then
        return item.window
      end
      reset = oldest + item.window - now_ms
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      if not state.buckets[1] then
        return item.window
      end
      reset = state.buckets[1][1] + item.window + quantum_of(item) - now_ms
    elseif algorithm == ALGORITHM_GCRA then
      local used = gcra_used(item, state)
      if used == 0 or item.limit == 0 then
        return item.window
      end
      local window = window_of(item)
      reset = ceil_div(used - (ceil_div(used, window) - 1) * window, item.limit)
    else
      reset = state.start + window_of(item) - now_ms
    end
    return math.max(reset, 0)
  end

  -- Records `item.take` (State::record); returns the undo token: the bucket start + 1, the
  -- window start + 1, GCRA's rate, or the lease token + 1 (0 for a lease renewed, which was not
  -- this request's to take back).
  local function record(item, state)
    local algorithm, hits = item.algorithm, item.take
    if algorithm == ALGORITHM_IN_FLIGHT then
      local score = now_ms
      local newest = lease_score(item.key, '-1')
      if newest and newest > score then
        score = newest
      end
      local added = redis.call('ZADD', item.key, format_integer(score), format_integer(item.param))
      state.count = state.count + added
      if added == 0 then
        return 0
      end
      return item.param + 1
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      local quantum = quantum_of(item)
      local start = math.floor(now_ms / quantum) * quantum
      local newest = state.buckets[#state.buckets]
      if newest and newest[1] >= start then
        start = newest[1]
        newest[2] = newest[2] + hits
      else
        state.buckets[#state.buckets + 1] = {start, hits}
      end
      state.total = state.total + hits
      redis.call('HINCRBY', item.key, format_number(start), format_number(hits))
      return start + 1
    elseif algorithm == ALGORITHM_GCRA then
      gcra_hold(item, state, math.min(gcra_used(item, state) + hits * window_of(item), MAX_EXACT))
      return rate_of(item)
    end
    state.current = state.current + hits
    return state.start + 1
  end

  -- Gives back up to `item.take`, newest first; for in_flight, releases the lease of the item's
  -- token and no other (token 0 releases nothing) (State::refund).
  local function refund(item, state)
    local algorithm, hits = item.algorithm, item.take
    if algorithm == ALGORITHM_IN_FLIGHT then
      if item.param ~= 0 then
        state.count = state.count - redis.call('ZREM', item.key, format_integer(item.param))
      end
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      while hits > 0 and state.buckets[#state.buckets] do
        local newest = state.buckets[#state.buckets]
        local take = math.min(newest[2], hits)
        newest[2] = newest[2] - take
        hits = hits - take
        state.total = state.total - take
        if newest[2] == 0 then
          table.remove(state.buckets)
          redis.call('HDEL', item.key, format_number(newest[1]))
        else
          redis.call('HSET', item.key, format_number(newest[1]), format_number(newest[2]))
        end
      end
    elseif algorithm == ALGORITHM_GCRA then
      gcra_hold(item, state, math.max(gcra_used(item, state) - hits * window_of(item), 0))
    else
      local take = math.min(hits, state.current)
      state.current = state.current - take
      state.previous = math.max(state.previous - (hits - take), 0)
    end
  end

  -- Stores a written key with its TTL, or deletes it once empty.
  local function store(item, state)
    local key, algorithm, window = item.key, item.algorithm, window_of(item)
    if algorithm == ALGORITHM_IN_FLIGHT then
      local newest = state.count > 0 and lease_score(key, '-1')
      if not newest then
        redis.call('DEL', key)
        return
      end
      redis.call('PEXPIRE', key, format_integer(math.max(newest + 2 * window - now_ms, 1)))
      return
    elseif algorithm == ALGORITHM_QUANTIZED_LOG then
      local newest = state.buckets[#state.buckets]
      if not newest then
        redis.call('DEL', key)
        return
      end
      local ttl = newest[1] + item.window + quantum_of(item) - now_ms
      redis.call('PEXPIRE', key, format_number(math.max(ttl, 1)))
      return
    end
    local value, ttl
    if algorithm == ALGORITHM_GCRA then
      if state.arrival == 0 and state.remainder == 0 then
        redis.call('DEL', key)
        return
      end
      value = encode_value(state.arrival, state.remainder)
      ttl = ceil_div(gcra_used(item, state), rate_of(item)) + window
    else
      if state.current == 0 and state.previous == 0 then
        redis.call('DEL', key)
        return
      end
      local index = math.floor(state.start / window)
      if algorithm == ALGORITHM_SLIDING_COUNTER then
        value = encode_value(index, state.current, state.previous)
      else
        value = encode_value(index, state.current)
      end
      ttl = state.start + 2 * window - now_ms
    end
    redis.call('SET', key, value, 'PX', format_number(math.max(ttl, 1)))
  end

  return {
    load = load, settle = settle, count = count, reset_ms = reset_ms,
    record = record, refund = refund, store = store,
  }
end
