-- Decides one request (or, in a batched call, several one after the other) atomically inside
-- Redis: every key of a request is read, checked and then written all or nothing, in one round
-- trip, so concurrent sidecars can never interleave between check and record.
--
-- KEYS, ARGV and the reply: the doc of `SCRIPT` in src/limiter/redis/script.rs, which assembles
-- the script: the layout header it generates, shared.lua, models.lua, then this file.
--
-- The steps are a transcription of `decide_batch` (src/limiter/window.rs) over the per-algorithm
-- models of src/limiter/algorithms.rs, which are the reference (a property test holds the two to
-- the same outcomes on random traces):
-- - phase 1, per item in order: bring the key to now (sliding log: ZREMRANGEBYSCORE of entries
--   at or before now - window; the other algorithms: settle a copy in Lua), then check
--   `count + earlier + hits <= capacity` (`< capacity` for a probe of 0 hits), `earlier` being
--   the hits earlier items of the request record on the same key (consume always, shadow and
--   quota only if they passed), the capacity the limit or GCRA's burst. Refunds pass. If the
--   request has quota items, at least one must pass;
-- - phase 2, only if every consume item passed: in request order, consume items and passed
--   shadow and quota items record their hits, refunds take back up to theirs, newest first; then
--   every written key gets its TTL, so idle keys vanish on their own. A rejected request writes
--   nothing but phase 1's evictions;
-- - every item reports its key's count and reset after the decision.
--
-- Data layout of the sliding log (the other algorithms': models.lua): a sorted set, one member
-- per hit, scored with the ms it was recorded. TTL: until the newest entry leaves the window, so
-- that idle keys vanish on their own.
--
-- Undo tokens (the reply's last numbers, which compensate.lua takes back): 0 when the item added
-- nothing; for the sliding log (score mod TOKEN_SCORE) * TOKEN_MEMBER + (first member -
-- LOG_MEMBER_FIRST) + 1, the item having added `hits` consecutive members, cyclically, from there
-- at that score (one ms later after a wrap); for the quantized log the bucket start + 1; for the
-- fixed window and the sliding counter the window start + 1; for GCRA its rate max(limit, 1).
--
-- Log members must be unique per key and short: a listpack stores an integer member of
-- LOG_MEMBER_FIRST..LOG_MEMBER_LAST (1000000..8388607) in 5 bytes (a 24-bit integer; a UUID
-- costs 37). So members are 7-digit integers assigned cyclically per key: a new key starts at
-- LOG_MEMBER_FIRST, then member = newest member + 1 per hit, wrapping from the last to the
-- first. Scores never decrease: score = max(now, newest score). Why this is safe across
-- instances and clock steps:
-- - with one width, Redis's tie-break between equal scores (lexicographic) is numeric order,
--   and with non-decreasing scores the newest entry is the last one: ZPOPMAX removes the newest
--   entries, and the next member follows the newest. At a wrap the new member would sort below
--   the newest at an equal score, so it and the rest of its item go 1 ms later: such an entry
--   counts 1 ms longer than the memory backend's would (conservative), once per 7.4 million;
-- - entries leave from the bottom (expiry) and the top (refunds), so the live members are one
--   cyclic range; a new member collides with a live one (ZADD would update it instead of adding
--   one: over-admission) only if the range's span plus the hits exceed the LOG_MEMBERS numbers.
--   The span is checked before anything is written, and the call fails with a `sluice:` error;
-- - a score never goes back in time, so a step back of the clock cannot make a new entry expire
--   before the one before it (the memory backend records at max(now, newest) too).
--
-- Cost (instructions per request: docs/performance.md, scripts/bench/script-cost.sh): a log
-- key's count is read once (ZCARD after the eviction) and its newest and oldest entry at most
-- once each, then kept up to date through the request's own adds and pops: an admitted single-hit
-- item costs ZREMRANGEBYSCORE, ZCARD, two ZRANGEs (none on an empty key), ZADD and PEXPIRE.
-- Every closure costs an allocation per call, so the other algorithms' models are only made
-- when a call has an item that needs them, and the per-request state is one table per item and
-- one per key. Every request shape takes the same path: a second copy for requests of
-- sliding-log items only would save about 3% of the instructions, not worth a second decision
-- (docs/performance.md).

-- The call's KEYS and ARGV as locals: the functions below read them as upvalues, which costs
-- less than a global per access.
local KEYS, ARGV = KEYS, ARGV

-- The call's clock: Redis TIME (every sidecar then uses the same clock, however skewed their
-- hosts are), or an explicit whole number of ms (tests).
local batched = ARGV[1] == BATCHED
local clock = ARGV[1]
if batched then
  clock = ARGV[2]
end
local now_ms
if clock == '' then
  local time = redis.call('TIME')
  now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now_ms = tonumber(clock)
  if not now_ms or now_ms % 1 ~= 0 then
    return redis.error_reply('sluice: bad now')
  end
end

-- A sliding-log key's entry at ZRANGE index `at`: '-1' the newest, '0' the oldest. Returns its
-- member and score, nil when the key is empty. Each end is read at most once per request (one
-- read serves both while the key holds one entry), then kept up to date by the request's own adds
-- and pops.
local function log_entry(key, state, at)
  if state.card == 0 then
    return nil
  end
  local newest = at == '-1'
  if newest and state.newest_score then
    return state.newest_member, state.newest_score
  elseif not newest and state.oldest_score then
    return state.oldest_member, state.oldest_score
  end
  local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
  -- A score Redis printed is always a number: `+ 0` parses it once, `tonumber` twice.
  local member, score = tonumber(entry[1]), entry[2] + 0
  if newest or state.card == 1 then
    state.newest_member, state.newest_score = member, score
  end
  if not newest or state.card == 1 then
    state.oldest_member, state.oldest_score = member, score
  end
  return member, score
end

-- How many member numbers the key's live entries span, oldest to newest, cyclically (cluster
-- compensation may leave holes, hence the span rather than the count).
local function log_span(key, state)
  local newest = log_entry(key, state, '-1')
  if not newest then
    return 0
  end
  return (newest - log_entry(key, state, '0')) % LOG_MEMBERS + 1
end

-- Adds `hits` entries to a log key; returns their undo token (see shared.lua).
local function log_add(key, state, hits)
  local newest_member, newest_score = log_entry(key, state, '-1')
  local score, member = now_ms, LOG_MEMBER_FIRST
  if newest_member then
    if newest_score > score then
      score = newest_score
    end
    if newest_member < LOG_MEMBER_LAST then
      member = newest_member + 1
    elseif score <= newest_score then
      -- A wrap: the new member sorts below the newest at an equal score, so it goes 1 ms later
      -- to stay the newest.
      score = newest_score + 1
    end
  end
  local token = (score % TOKEN_SCORE) * TOKEN_MEMBER + (member - LOG_MEMBER_FIRST) + 1
  if state.card == 0 then
    state.oldest_member, state.oldest_score = member, score
  end
  state.card = state.card + hits
  if hits == 1 then
    -- The usual single hit, without the argument table.
    state.newest_member, state.newest_score = member, score
    redis.call('ZADD', key, format_integer(score), format_integer(member))
    return token
  end
  while hits > 0 do
    local chunk = math.min(hits, MEMBERS_PER_COMMAND)
    local args = {}
    local printed_score = format_integer(score)
    for j = 1, chunk do
      args[2 * j - 1] = printed_score
      args[2 * j] = format_integer(member)
      state.newest_member, state.newest_score = member, score
      member = member + 1
      if member > LOG_MEMBER_LAST then
        -- The same at a wrap inside this item.
        member = LOG_MEMBER_FIRST
        score = score + 1
        printed_score = format_integer(score)
      end
    end
    redis.call('ZADD', key, unpack(args))
    hits = hits - chunk
  end
  return token
end

-- Phase 1 for a sliding-log item: evicts what left the window and returns the key's count.
local function log_settle(item, state)
  local removed = redis.call('ZREMRANGEBYSCORE', item.key, '-inf',
    format_integer(now_ms - item.window))
  if not state.card then
    state.card = redis.call('ZCARD', item.key)
  elseif removed > 0 then
    -- The key again, with a shorter window than an earlier item's.
    state.card = state.card - removed
    state.newest_score, state.oldest_score = false, false
  end
  return state.card
end

-- Phase 2 for a sliding-log item: records its hits or takes back its refund; whether it wrote.
local function log_write(item, state)
  if item.kind ~= KIND_REFUND then
    item.undo = log_add(item.key, state, item.hits)
    return true
  end
  local take = math.min(item.hits, state.card)
  if take == 0 then
    return false
  end
  redis.call('ZPOPMAX', item.key, format_number(take))
  state.card = state.card - take
  state.newest_score = false
  return true
end

-- A written log key's TTL: until its newest entry leaves the window of `writer`, the first item
-- that wrote it.
local function log_store(writer, state)
  local _, newest_score = log_entry(writer.key, state, '-1')
  if newest_score then
    local ttl = newest_score + writer.window - now_ms
    if ttl < 1 then
      ttl = 1
    end
    redis.call('PEXPIRE', writer.key, format_integer(ttl))
  end
end

-- A log item's reset: until its key's oldest entry leaves the window; the window when empty.
local function log_reset_ms(item, state)
  local _, oldest_score = log_entry(item.key, state, '0')
  if not oldest_score then
    return item.window
  end
  local reset = oldest_score + item.window - now_ms
  if reset < 0 then
    return 0
  end
  return reset
end

-- The other algorithms' models (models.lua), made on a call's first item that needs them.
local lua_models
local function models()
  if not lua_models then
    lua_models = make_models(now_ms)
  end
  return lua_models
end

-- Reads the `n` items of one request, KEYS[first_key + 1 ..] and ARGV[first_arg + 1 ..]: one
-- table per item, each with its key's state. Returns nil and an error message for a malformed
-- item, before anything is read from or written to Redis.
local function read_items(first_key, first_arg, n)
  local items = {}
  for i = 1, n do
    local key, at = KEYS[first_key + i], first_arg + (i - 1) * ARGS_PER_ITEM
    local limit, window, hits = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
      tonumber(ARGV[at + 3])
    local kind, algorithm, param = ARGV[at + 4], ARGV[at + 5], tonumber(ARGV[at + 6])
    -- Whole windows and hits: times and members are printed as integers.
    if not (limit and window and hits and param) or window % 1 ~= 0 or hits % 1 ~= 0 then
      return nil, 'sluice: bad number in item ' .. i
    end
    if kind ~= KIND_CONSUME and kind ~= KIND_SHADOW and kind ~= KIND_REFUND
        and kind ~= KIND_QUOTA then
      return nil, 'sluice: bad kind in item ' .. i
    end
    if algorithm ~= ALGORITHM_SLIDING_LOG and algorithm ~= ALGORITHM_QUANTIZED_LOG
        and algorithm ~= ALGORITHM_SLIDING_COUNTER and algorithm ~= ALGORITHM_GCRA
        and algorithm ~= ALGORITHM_FIXED_WINDOW then
      return nil, 'sluice: bad algorithm in item ' .. i
    end
    -- The state of an earlier item's key, else a new one. A linear scan: requests carry a
    -- handful of items, and a table of keys would cost more than the scan.
    local state
    for j = 1, i - 1 do
      if items[j].key == key then
        state = items[j].state
        break
      end
    end
    if not state then
      -- A key's state during the request, shared by its items: `earlier`, the hits earlier
      -- items record on it; `writer`, the item whose write decides its TTL (false: not
      -- written); for a sliding log its count (false: not read yet) and its newest and oldest
      -- entry (log_entry); for the other algorithms what models().load reads.
      if algorithm == ALGORITHM_SLIDING_LOG then
        state = {
          algorithm = algorithm, earlier = 0, writer = false, card = false,
          newest_member = false, newest_score = false, oldest_member = false, oldest_score = false,
        }
      else
        state = {algorithm = algorithm, earlier = 0, writer = false, loaded = false}
      end
    elseif state.algorithm ~= algorithm then
      return nil, 'sluice: the key of item ' .. i .. ' has two algorithms'
    end
    items[i] = {
      key = key, limit = limit, window = window, hits = hits, kind = kind,
      algorithm = algorithm, param = param, state = state, passed = false, undo = 0,
    }
  end
  return items
end

-- Phase 1: brings every item's key to now and checks the item; nothing but expired entries is
-- removed. Returns whether the request is admitted.
local function check(items, n)
  local admitted = true
  local any_quota, quota_passed = false, false
  for i = 1, n do
    local item = items[i]
    local state, kind = item.state, item.kind
    local count, capacity = 0, item.limit
    if item.algorithm == ALGORITHM_SLIDING_LOG then
      count = log_settle(item, state)
    else
      local model = models()
      if not state.loaded then
        model.load(item, state)
        state.loaded = true
      end
      model.settle(item, state)
      if kind ~= KIND_REFUND then
        count = model.count(item, state)
      end
      if item.algorithm == ALGORITHM_GCRA then
        -- The burst; none at a rate of 0.
        capacity = 0
        if item.limit > 0 then
          capacity = item.param
        end
      end
    end
    if kind == KIND_REFUND then
      item.passed = true
    else
      local seen = count + state.earlier
      if item.hits == 0 then
        item.passed = seen < capacity
      else
        item.passed = seen + item.hits <= capacity
      end
      -- An admitted request records every consume item, and shadow and quota items that passed.
      if kind == KIND_CONSUME or item.passed then
        state.earlier = state.earlier + item.hits
      end
      if kind == KIND_CONSUME then
        admitted = admitted and item.passed
      elseif kind == KIND_QUOTA then
        any_quota = true
        quota_passed = quota_passed or item.passed
      end
    end
  end
  -- quota_mode: an over-limit quota item fails the request only when every quota item is over.
  return admitted and (quota_passed or not any_quota)
end

-- Phase 2, for an admitted request (every consume item passed, refunds pass): in request order,
-- items that passed record their hits or take back their refund; then each written key gets its
-- TTL, or its value and TTL. Returns an error reply instead, having written nothing, if a log key
-- would reach one of its live members.
local function write(items, n)
  for i = 1, n do
    local item = items[i]
    local state = item.state
    -- `earlier` is now every hit the request adds to the key. ZADD would update a live member
    -- instead of adding one; it takes about 7.4 million live entries.
    if item.algorithm == ALGORITHM_SLIDING_LOG and item.kind ~= KIND_REFUND and item.passed
        and item.hits > 0 and log_span(item.key, state) + state.earlier > LOG_MEMBERS then
      return redis.error_reply('sluice: sliding log ' .. item.key .. ' is full (members wrap)')
    end
  end
  for i = 1, n do
    local item = items[i]
    local state = item.state
    if item.passed and item.hits > 0 then
      if item.algorithm == ALGORITHM_SLIDING_LOG then
        -- A log's TTL follows the window of the first item that wrote to it.
        if log_write(item, state) and not state.writer then
          state.writer = item
        end
      else
        -- The other models store what their last writing item sees.
        if item.kind == KIND_REFUND then
          models().refund(item, state)
        else
          item.undo = models().record(item, state)
        end
        state.writer = item
      end
    end
  end
  for i = 1, n do
    local state = items[i].state
    local writer = state.writer
    if writer then
      if writer.algorithm == ALGORITHM_SLIDING_LOG then
        log_store(writer, state)
      else
        models().store(writer, state)
      end
      state.writer = false
    end
  end
  return nil
end

-- The reply of a decided request (see `SCRIPT` in script.rs): {admitted, then passed, count and
-- reset_ms per item, then the undo token per item}. Filled in index order, so the table only
-- ever grows its array part.
local function outcomes(items, n, admitted)
  local reply = {admitted and 1 or 0}
  for i = 1, n do
    local item = items[i]
    local state = item.state
    reply[3 * i - 1] = item.passed and 1 or 0
    if item.algorithm == ALGORITHM_SLIDING_LOG then
      reply[3 * i] = state.card
      reply[3 * i + 1] = log_reset_ms(item, state)
    else
      reply[3 * i] = models().count(item, state)
      reply[3 * i + 1] = models().reset_ms(item, state)
    end
  end
  for i = 1, n do
    reply[1 + 3 * n + i] = items[i].undo
  end
  return reply
end

-- Decides the request of `n` items at KEYS[first_key + 1 ..] and ARGV[first_arg + 1 ..];
-- returns its reply.
local function decide(first_key, first_arg, n)
  local items, malformed = read_items(first_key, first_arg, n)
  if not items then
    return redis.error_reply(malformed)
  end
  local admitted = check(items, n)
  if admitted then
    local refused = write(items, n)
    if refused then
      return refused
    end
  end
  return outcomes(items, n, admitted)
end

if not batched then
  if #ARGV ~= 1 + ARGS_PER_ITEM * #KEYS then
    return redis.error_reply('sluice: expected 1 + ' .. ARGS_PER_ITEM .. ' * #KEYS arguments')
  end
  return decide(0, 1, #KEYS)
end

-- Several requests in one call, decided one after the other as if each had its own call.
local requests = tonumber(ARGV[3])
if not requests or requests < 1 or #ARGV < 3 + requests then
  return redis.error_reply('sluice: bad group count')
end
local sizes, total = {}, 0
for r = 1, requests do
  sizes[r] = tonumber(ARGV[3 + r])
  if not sizes[r] or sizes[r] < 0 then
    return redis.error_reply('sluice: bad size of group ' .. r)
  end
  total = total + sizes[r]
end
if #KEYS ~= total or #ARGV ~= 3 + requests + ARGS_PER_ITEM * total then
  return redis.error_reply('sluice: group sizes do not match KEYS and ARGV')
end
local replies = {}
local first_key, first_arg = 0, 3 + requests
for r = 1, requests do
  replies[r] = decide(first_key, first_arg, sizes[r])
  first_key = first_key + sizes[r]
  first_arg = first_arg + ARGS_PER_ITEM * sizes[r]
end
return replies
