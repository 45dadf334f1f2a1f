-- Decides one request (or, in a batched call, several one after the other) atomically inside
-- Redis: every key of a request is read, checked and then written as its verdict says, in one
-- round trip. KEYS, ARGV and the reply: `LIBRARY` in src/limiter/redis/script.rs, which
-- assembles the library: the header it generates, shared.lua, models.lua, this file, then
-- library.lua, which registers decide_call (the end of this file) as the library's function.
-- Everything else here is made once, when Redis loads the library, not per call.
--
-- A transcription of `decide_batch` (src/limiter/window.rs) over the models of
-- src/limiter/algorithms.rs, which are the reference (tests/it/differential.rs holds the two to the
-- same outcomes on random traces); what each item records is defined once, in the doc of
-- src/limiter/mod.rs. A request is read (read_item), checked (check: phase 1, which writes
-- nothing to a sliding log), recorded (write: phase 2) and reported (report); the common request
-- of one sliding-log item that fits is decided without those tables and phases (decide_one),
-- with the same commands, writes and reply.
--
-- The sliding log (the other algorithms: models.lua) is one sorted set per key: one member per
-- entry, i.e. per item that recorded, whatever its weight (log_add has the members' form), scored
-- with the ms it was recorded at, and LOG_TOTAL_MEMBER holding the key's total
-- (store_log_total in shared.lua). A request reads no more entries than it evicts (log_settle).
-- Instructions per request, and what they go to: docs/performance.md.

-- Entries a refund reads per ZRANGE, newest first.
local REFUND_READ = 64

-- ZRANGE indices of a log key's newest entry and oldest entry (the total's member is first).
local NEWEST, OLDEST = '-1', '1'

-- Remembers a log key's entry, read as `member` and `score` (a ZRANGE reply's strings), as its
-- newest or oldest; an entry that holds the whole total is both.
local function note_entry(state, member, score, newest)
  local number, weight = parse_log_member(member)
  -- A score Redis printed is always a number: `+ 0` parses it once, `tonumber` twice.
  score = score + 0
  local alone = weight == state.total
  if newest or alone then
    state.newest_member, state.newest_score = number, score
  end
  if not newest or alone then
    state.oldest_member, state.oldest_score = number, score
  end
end

-- A sliding-log key's entry at `at`, NEWEST or OLDEST: its number and score, nil when the key
-- is empty. Each end is read at most once per request (phase 1 reads the oldest), then kept up
-- to date by the request's own adds and refunds: Redis 7.0 prints every score it returns with
-- '%.17g', which costs about as much as a command, so scores are only asked for where needed.
local function log_entry(key, state, at)
  if state.total == 0 then
    return nil
  end
  local newest = at == NEWEST
  if newest and not state.newest_score or not newest and not state.oldest_score then
    local entry = redis.call('ZRANGE', key, at, at, 'WITHSCORES')
    note_entry(state, entry[1], entry[2], newest)
  end
  if newest then
    return state.newest_member, state.newest_score
  end
  return state.oldest_member, state.oldest_score
end

-- How many member numbers the key's live entries span, oldest to newest, cyclically (cluster
-- compensation may leave holes, hence the span rather than the count).
local function log_span(key, state)
  local newest = log_entry(key, state, NEWEST)
  if not newest then
    return 0
  end
  return (newest - log_entry(key, state, OLDEST)) % LOG_MEMBERS + 1
end

-- The score and number of an entry recorded at `at` (now_ms, or later for a held item: the
-- `hold` of log_add) after the newest entry `newest_member` at `newest_score` (nil on an empty
-- key). An entry's undo token is (score mod TOKEN_SCORE) *
-- TOKEN_MEMBER + (number - LOG_MEMBER_FIRST) + 1 (entry_token; compensate.lua's undo_log finds
-- the entry from it).
--
-- An entry's member must be unique per key and short: a listpack stores an integer of
-- LOG_MEMBER_FIRST..LOG_MEMBER_LAST (7 digits) in 5 bytes where a UUID costs 37. So a member is
-- a number, the newest entry's + 1 (LOG_MEMBER_FIRST on a new key, wrapping from the last to the
-- first), followed by the entry's weight unless that is 1 (log_member in shared.lua: `1000041`
-- weighs 1, `10000412000` 2000). The score is max(at, newest score), never back in time (as
-- the memory backend records), so that entries of equal score sort by number and the newest is
-- the last (refunds take from there). This is safe across instances and clock steps because:
-- - at a wrap the new number would sort below the newest at an equal score, so the entry goes
--   1 ms later (it counts 1 ms longer, conservative, once per 7.4 million entries);
-- - entries leave from the bottom (expiry) and the top (refunds), so the live numbers are one
--   cyclic range, and write checks before writing anything that the request's new entries do
--   not reach a live number (log_span; it takes 7.4 million live entries in one window).
local function next_entry(at, newest_member, newest_score)
  local score, member = at, LOG_MEMBER_FIRST
  if newest_member then
    if newest_score > score then
      score = newest_score
    end
    if newest_member < LOG_MEMBER_LAST then
      member = newest_member + 1
    elseif score <= newest_score then
      -- A wrap: the new number sorts below the newest at an equal score, so it goes 1 ms later
      -- to stay the newest.
      score = newest_score + 1
    end
  end
  return score, member
end

-- The undo token of the entry `member` at `score` (see next_entry).
local function entry_token(score, member)
  return (score % TOKEN_SCORE) * TOKEN_MEMBER + (member - LOG_MEMBER_FIRST) + 1
end

-- Adds one entry of `weight` to a log key (next_entry), dated `hold` ms after now (a held item,
-- `hold_ms` in src/limiter/mod.rs; 0 for every request), with the key's new total; returns its
-- undo token.
local function log_add(key, state, weight, hold)
  local score, member = next_entry(now_ms + hold, log_entry(key, state, NEWEST))
  if state.total == 0 then
    state.oldest_member, state.oldest_score = member, score
  end
  state.total = state.total + weight
  state.newest_member, state.newest_score = member, score
  state.stale = false
  redis.call('ZADD', key, format_integer(-state.total), LOG_TOTAL_MEMBER, format_integer(score),
    log_member(member, weight))
  return entry_token(score, member)
end

-- Takes up to `hits` of a log key's newest weight: whole entries, newest first, and part of the
-- last one reached (its member then carries the weight left). Returns whether it wrote.
local function log_refund(key, state, hits)
  local take = math.min(hits, state.total)
  if take == 0 then
    return false
  end
  state.stale = false
  if take == state.total then
    redis.call('DEL', key)
    state.total, state.newest_score, state.oldest_score = 0, false, false
    return true
  end
  -- The entries hold more than `take`, so the loop ends before the oldest entry is gone.
  local left = take
  state.newest_score = false
  while left > 0 do
    local read = redis.call('ZRANGE', key, format_integer(-math.min(left, REFUND_READ)), '-1',
      'WITHSCORES')
    local gone = {}
    for j = #read - 1, 1, -2 do
      if read[j] == LOG_TOTAL_MEMBER then
        break
      end
      local member, weight = parse_log_member(read[j])
      gone[#gone + 1] = read[j]
      if weight > left then
        redis.call('ZADD', key, read[j + 1], log_member(member, weight - left))
        state.newest_member, state.newest_score = member, read[j + 1] + 0
        left = 0
        break
      end
      left = left - weight
      if left == 0 then
        break
      end
    end
    if #gone == 0 then
      -- No entry left: a total out of step with the entries (never written so).
      break
    end
    redis.call('ZREM', key, unpack(gone))
  end
  state.total = state.total - take
  store_log_total(key, state.total)
  return true
end

-- What decide_one read of a key's bottom before it left the request to decide (read_ahead, the
-- ZRANGE reply, of key read_ahead_key; false when none), which log_settle takes instead of
-- reading it again.
local read_ahead_key, read_ahead = false, false

-- Phase 1 for a sliding-log item: the key's count at now. The first item of a key reads its
-- total and oldest entry in one ZRANGE (the total's member is first; read_ahead if there); only
-- when that entry has left the window is what left read (members only, by score). A later item
-- of the key with a shorter window reads only what it adds. The entries that left are removed in
-- phase 2 (log_evict), so that phase 1 writes nothing.
local function log_settle(item, state)
  local key, cutoff = item.key, now_ms - item.window
  local from
  if state.total then
    if cutoff <= state.cutoff or state.total == 0 then
      return state.total
    end
    -- Entries score 0 or more, the total's member less.
    from = '(' .. format_integer(math.max(state.cutoff, -1))
  else
    state.total = 0
    local bottom = read_ahead
    if key == read_ahead_key then
      read_ahead_key = false
    else
      bottom = redis.call('ZRANGE', key, '0', '1', 'WITHSCORES')
    end
    if bottom[1] == LOG_TOTAL_MEMBER then
      state.total = -bottom[2]
      if bottom[3] then
        note_entry(state, bottom[3], bottom[4], false)
      else
        -- The total's member alone (never written so): the key is empty.
        state.total, state.stale = 0, true
      end
    end
    if state.total == 0 or state.oldest_score > cutoff then
      state.cutoff = cutoff
      return state.total
    end
    from = '0'
  end
  state.cutoff = cutoff
  local read = redis.call('ZRANGE', key, from, format_integer(cutoff), 'BYSCORE')
  local expired = 0
  for j = 1, #read do
    local _, weight = parse_log_member(read[j])
    expired = expired + weight
  end
  if expired > 0 then
    state.total, state.evict, state.oldest_score = math.max(state.total - expired, 0), true, false
    if state.total == 0 then
      state.newest_score = false
    end
  end
  return state.total
end

-- Phase 2, first step for a log key: removes the entries phase 1 found expired; the total is
-- stored with the key's next write, or on its own (store_stale_totals).
local function log_evict(key, state)
  if state.evict then
    redis.call('ZREMRANGEBYSCORE', key, '0', format_integer(state.cutoff))
    state.evict, state.stale = false, true
  end
end

-- Phase 2 for a sliding-log item: records its take or takes back its refund; whether it wrote,
-- and the undo token of what it recorded (0 for a refund).
local function log_write(item, state)
  if item.kind == KIND_REFUND then
    return log_refund(item.key, state, item.take), 0
  end
  return true, log_add(item.key, state, item.take, item.param)
end

-- Sets a log key's TTL: until its newest entry, at `newest_score`, leaves `window`.
local function log_expire(key, newest_score, window)
  local ttl = newest_score + window - now_ms
  if ttl < 1 then
    ttl = 1
  end
  redis.call('PEXPIRE', key, format_integer(ttl))
end

-- A written log key's TTL: until its newest entry leaves the window of `writer`, the first item
-- that wrote it.
local function log_store(writer, state)
  local _, newest_score = log_entry(writer.key, state, NEWEST)
  if newest_score then
    log_expire(writer.key, newest_score, writer.window)
  end
end

-- A log item's reset, for a key whose oldest entry is at `oldest_score`: until that entry
-- leaves `window`.
local function reset_after(oldest_score, window)
  local reset = oldest_score + window - now_ms
  if reset < 0 then
    return 0
  end
  return reset
end

-- A log item's reset: reset_after its key's oldest entry; the window when empty.
local function log_reset_ms(item, state)
  local _, oldest_score = log_entry(item.key, state, OLDEST)
  if not oldest_score then
    return item.window
  end
  return reset_after(oldest_score, item.window)
end

-- The other algorithms' models (models.lua), made once.
local lua_models = make_models()
local function models()
  return lua_models
end

-- Reads item `i` of a request into items[i], with its key's state (shared with the request's
-- earlier items on the key), from its key and its arguments (the main chunk reads them from
-- ARGV, see its end). Returns an error message for a malformed item, before anything is read
-- from or written to Redis.
local function read_item(items, i, key, limit, window, hits, kind, algorithm, param, over_limit)
  -- Whole windows and hits: times and weights are printed as integers.
  if not (limit and window and hits and param) or window % 1 ~= 0 or hits % 1 ~= 0
      or hits < 0 or param % 1 ~= 0 or param < 0 then
    return 'sluice: bad number in item ' .. i
  end
  if kind ~= KIND_CONSUME and kind ~= KIND_SHADOW and kind ~= KIND_REFUND
      and kind ~= KIND_QUOTA then
    return 'sluice: bad kind in item ' .. i
  end
  if algorithm ~= ALGORITHM_SLIDING_LOG and algorithm ~= ALGORITHM_QUANTIZED_LOG
      and algorithm ~= ALGORITHM_SLIDING_COUNTER and algorithm ~= ALGORITHM_GCRA
      and algorithm ~= ALGORITHM_FIXED_WINDOW and algorithm ~= ALGORITHM_IN_FLIGHT then
    return 'sluice: bad algorithm in item ' .. i
  end
  -- Leases count requests: an in_flight item's hits count as at most 1 (counted_hits).
  if algorithm == ALGORITHM_IN_FLIGHT and hits > 1 then
    hits = 1
  end
  if over_limit ~= OVER_LIMIT_FILL and over_limit ~= OVER_LIMIT_REFUSE
      and over_limit ~= OVER_LIMIT_RECORD then
    return 'sluice: bad over_limit in item ' .. i
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
    -- A key's state during the request, shared by its items: `earlier` and `rejected`, what
    -- earlier items record on it if the request is admitted or rejected; `adds`, the entries
    -- the request adds to a log; `writer`, the item whose write decides its TTL (false: not
    -- written); for a sliding log its total (false: not read yet), the `cutoff` it was read
    -- up to, whether entries wait to be removed (`evict`, log_evict) and whether that left
    -- the stored total `stale`, and its newest and oldest entry (log_entry); for the other
    -- algorithms what models().load reads.
    if algorithm == ALGORITHM_SLIDING_LOG then
      state = {
        algorithm = algorithm, earlier = 0, rejected = 0, adds = 0, writer = false,
        total = false, cutoff = false, evict = false, stale = false, newest_member = false,
        newest_score = false, oldest_member = false, oldest_score = false,
      }
    else
      state = {algorithm = algorithm, earlier = 0, rejected = 0, writer = false, loaded = false}
    end
  elseif state.algorithm ~= algorithm then
    return 'sluice: the key of item ' .. i .. ' has two algorithms'
  end
  items[i] = {
    key = key, limit = limit, window = window, hits = hits, kind = kind,
    algorithm = algorithm, param = param, over_limit = over_limit, state = state,
    passed = false, if_admitted = 0, if_rejected = 0, take = 0, undo = 0, count = 0, reset_ms = 0,
  }
  return nil
end

-- What an item records when it is not recorded as admitted (window.rs, over_limit_take):
-- nothing; as much of its cost as fits after `seen` if it did not pass; or its whole cost;
-- never past MAX_EXACT (the reference's MAX_COUNT). Nothing for in_flight, whose leases only
-- admitted requests hold.
local function over_limit_take(item, seen, capacity)
  local over_limit, limit = item.over_limit, capacity
  if item.algorithm == ALGORITHM_IN_FLIGHT then
    return 0
  elseif over_limit == OVER_LIMIT_RECORD then
    limit = MAX_EXACT
  elseif over_limit == OVER_LIMIT_REFUSE or item.passed then
    return 0
  end
  return math.max(math.min(item.hits, limit - seen), 0)
end

-- Phase 1: brings every item's key to now, checks the item and fixes its take under either
-- verdict; nothing but expired entries is removed. Returns whether the request is admitted.
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
      item.passed, item.if_admitted = true, item.hits
    else
      local seen = count + state.earlier
      if item.hits == 0 then
        item.passed = seen < capacity
      else
        item.passed = seen + item.hits <= capacity
      end
      -- An admitted request records every consume item, and shadow and quota items that
      -- passed; the others record what over_limit says (nothing for refuse, nothing for a fill
      -- item that passed, the usual case).
      local if_admitted, if_rejected = item.hits, 0
      if item.over_limit == OVER_LIMIT_RECORD or not item.passed then
        if kind ~= KIND_CONSUME and not item.passed then
          if_admitted = over_limit_take(item, seen, capacity)
        end
        if_rejected = over_limit_take(item, count + state.rejected, capacity)
      end
      item.if_admitted, item.if_rejected = if_admitted, if_rejected
      state.earlier = state.earlier + if_admitted
      state.rejected = state.rejected + if_rejected
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

-- Stores the total of each log key whose evictions changed it and that nothing wrote since.
local function store_stale_totals(items, n)
  for i = 1, n do
    local state = items[i].state
    if state.stale then
      store_log_total(items[i].key, state.total)
      state.stale = false
    end
  end
end

-- Phase 2: in request order, each item records its take for the verdict, and on an admitted
-- request refunds take back theirs; then each written key gets its TTL, or its value and TTL,
-- and a log whose evictions alone changed its total gets the total. Returns an error reply
-- instead, having written nothing, if a log key would reach one of its live members.
local function write(items, n, admitted)
  local adds = false
  for i = 1, n do
    local item = items[i]
    local take = item.if_rejected
    if admitted then
      take = item.if_admitted
    end
    item.take = take
    if item.algorithm == ALGORITHM_SLIDING_LOG then
      local state = item.state
      if state.evict then
        log_evict(item.key, state)
      end
      if take > 0 and item.kind ~= KIND_REFUND then
        state.adds, adds = state.adds + 1, true
      end
    end
  end
  for i = 1, adds and n or 0 do
    local item = items[i]
    local state = item.state
    -- ZADD would update a live member instead of adding one; it takes about 7.4 million live
    -- entries.
    if item.algorithm == ALGORITHM_SLIDING_LOG and state.adds > 0
        and log_span(item.key, state) + state.adds > LOG_MEMBERS then
      store_stale_totals(items, n)
      return redis.error_reply('sluice: sliding log ' .. item.key .. ' is full (members wrap)')
    end
  end
  for i = 1, n do
    local item = items[i]
    if item.take > 0 then
      local state = item.state
      -- Recorded only because the request was admitted: what compensation takes back (an
      -- in_flight item ignores over_limit: it records nothing unless admitted).
      local undoable = admitted and item.passed
        and (item.over_limit ~= OVER_LIMIT_RECORD or item.algorithm == ALGORITHM_IN_FLIGHT)
      local token = 0
      if item.algorithm == ALGORITHM_SLIDING_LOG then
        local wrote
        wrote, token = log_write(item, state)
        -- A log's TTL follows the window of the first item that wrote to it.
        if wrote and not state.writer then
          state.writer = item
        end
      else
        -- The other models store what their last writing item sees.
        if item.kind == KIND_REFUND then
          models().refund(item, state)
        else
          token = models().record(item, state)
        end
        state.writer = item
      end
      if undoable then
        item.undo = token
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
  store_stale_totals(items, n)
  return nil
end

-- Each item's count and reset after the decision, into the item.
local function report(items, n)
  for i = 1, n do
    local item = items[i]
    local state = item.state
    if item.algorithm == ALGORITHM_SLIDING_LOG then
      item.count, item.reset_ms = state.total, log_reset_ms(item, state)
    else
      item.count, item.reset_ms = models().count(item, state), models().reset_ms(item, state)
    end
  end
end

-- Decides a request of `n` items (read_item): returns whether it is admitted, each item's
-- outcome in the item (passed, count, reset_ms, undo); or an error reply, having written
-- nothing.
local function decide(items, n)
  local admitted = check(items, n)
  local refused = write(items, n, admitted)
  if refused then
    return refused
  end
  report(items, n)
  return admitted
end

-- The most common request, decided without the tables and phases of decide: one sliding-log
-- item consuming `hits` (more than 0) that fit under `limit`, on a key none of whose entries has
-- left the window. The same commands, writes and reply as decide, from the same helpers
-- (next_entry, entry_token, log_expire, reset_after); any other request returns nil, having
-- written nothing, and decide goes on from the key's bottom read here (read_ahead). The
-- batched-call property test (tests/it/differential.rs) holds the two paths to the same replies:
-- a batched call always takes decide, the same requests sent alone come here.
local function decide_one(key, limit, window, hits, over_limit)
  local bottom = redis.call('ZRANGE', key, '0', '1', 'WITHSCORES')
  read_ahead_key, read_ahead = key, bottom
  local total, newest_member, newest_score = 0, nil, nil
  local oldest_member, oldest_score
  if bottom[1] then
    if bottom[1] ~= LOG_TOTAL_MEMBER or not bottom[3] then
      return nil
    end
    local weight
    total = -bottom[2]
    oldest_member, weight = parse_log_member(bottom[3])
    oldest_score = bottom[4] + 0
    if oldest_score <= now_ms - window then
      return nil
    end
    newest_member, newest_score = oldest_member, oldest_score
    if weight ~= total then
      local top = redis.call('ZRANGE', key, NEWEST, NEWEST, 'WITHSCORES')
      newest_member, newest_score = parse_log_member(top[1]), top[2] + 0
    end
    -- A new member would reach a live one (see write).
    if (newest_member - oldest_member) % LOG_MEMBERS + 2 > LOG_MEMBERS then
      return nil
    end
  end
  if total + hits > limit then
    return nil
  end
  read_ahead_key = false
  local score, member = next_entry(now_ms, newest_member, newest_score)
  total = total + hits
  redis.call('ZADD', key, format_integer(-total), LOG_TOTAL_MEMBER, format_integer(score),
    log_member(member, hits))
  log_expire(key, score, window)
  local undo = 0
  if over_limit ~= OVER_LIMIT_RECORD then
    undo = entry_token(score, member)
  end
  -- The reply's layout as decide_request's, in a table made at its full length.
  local reply = {1, 0, 0, 0, 0}
  reply[REPLY_HEAD + REPLY_PASSED] = 1
  reply[REPLY_HEAD + REPLY_COUNT] = total
  reply[REPLY_HEAD + REPLY_RESET_MS] = reset_after(oldest_score or score, window)
  reply[REPLY_HEAD + REPLY_UNDO] = undo
  return reply
end

-- The reply of the request of `n` items whose keys follow keys[first_key] and whose arguments
-- follow args[at], decided by decide (the reply's layout: `LIBRARY` in script.rs).
local function decide_request(keys, args, first_key, at, n, batched)
  local items = {}
  for i = 1, n do
    local malformed = read_item(items, i, keys[first_key + i], tonumber(args[at + ARG_LIMIT]),
      tonumber(args[at + ARG_WINDOW_MS]), tonumber(args[at + ARG_HITS]), args[at + ARG_KIND],
      args[at + ARG_ALGORITHM], tonumber(args[at + ARG_PARAM]), args[at + ARG_OVER_LIMIT])
    if malformed then
      return redis.error_reply(malformed)
    end
    at = at + ARGS_PER_ITEM
  end
  local ok, admitted = true
  if batched then
    -- Each request stands alone: a command that fails inside one (a key holding another type,
    -- WRONGTYPE) becomes that request's error reply, and the others are decided as usual. The
    -- failure comes from phase 1 (every key is read, type-checked, before anything is
    -- recorded), so the failed request has written nothing but phase 1's evictions.
    ok, admitted = pcall(decide, items, n)
  else
    admitted = decide(items, n)
  end
  if not ok then
    return redis.error_reply(type(admitted) == 'table' and admitted.err or tostring(admitted))
  elseif type(admitted) ~= 'boolean' then
    return admitted
  end
  -- The verdict (REPLY_HEAD elements), then each item's REPLY_PER_ITEM elements at their
  -- REPLY_* offsets. Filled in index order (the offsets' order), so the table only ever grows
  -- its array part.
  local reply = {admitted and 1 or 0}
  at = REPLY_HEAD
  for i = 1, n do
    local item = items[i]
    reply[at + REPLY_PASSED] = item.passed and 1 or 0
    reply[at + REPLY_COUNT] = item.count
    reply[at + REPLY_RESET_MS] = item.reset_ms
    reply[at + REPLY_UNDO] = item.undo
    at = at + REPLY_PER_ITEM
  end
  return reply
end

-- The reply of the request of one item, of `key` and the arguments after args[at], if
-- decide_one decides it; false if not (decide_request then does, from read_ahead). Arguments
-- that read_item would refuse are left to it. In a batched call, a command that fails (a key
-- holding another type, WRONGTYPE) is the request's error reply, as in decide_request:
-- decide_one writes nothing before its last read.
local function decide_alone(key, args, at, batched)
  if args[at + ARG_ALGORITHM] ~= ALGORITHM_SLIDING_LOG or args[at + ARG_KIND] ~= KIND_CONSUME
      or args[at + ARG_PARAM] ~= '0' then
    return false
  end
  local limit, window, hits = tonumber(args[at + ARG_LIMIT]), tonumber(args[at + ARG_WINDOW_MS]),
    tonumber(args[at + ARG_HITS])
  local over_limit = args[at + ARG_OVER_LIMIT]
  if not (limit and window and hits and window % 1 == 0 and hits % 1 == 0 and hits > 0
      and (over_limit == OVER_LIMIT_FILL or over_limit == OVER_LIMIT_REFUSE
        or over_limit == OVER_LIMIT_RECORD)) then
    return false
  end
  if not batched then
    return decide_one(key, limit, window, hits, over_limit) or false
  end
  local ok, reply = pcall(decide_one, key, limit, window, hits, over_limit)
  if not ok then
    return redis.error_reply(type(reply) == 'table' and reply.err or tostring(reply))
  end
  return reply or false
end

-- Decides the call of `keys` and `args` (the KEYS and ARGV documented on `LIBRARY`): its
-- requests, one or several in a batched call, decided one after the other as if each had its
-- own call. Returns the reply.
local function decide_call(keys, args)
  start_call()
  local batched = args[1] == BATCHED
  local clock = args[1]
  if batched then
    clock = args[2]
  end
  now_ms = read_clock(clock)
  if not now_ms then
    return redis.error_reply('sluice: bad now')
  end
  read_ahead_key = false
  local requests, sizes, replies, first_arg = 1, nil, nil, 1
  if batched then
    requests = tonumber(args[3])
    if not requests or requests < 1 or #args < 3 + requests then
      return redis.error_reply('sluice: bad group count')
    end
    local total = 0
    sizes, replies, first_arg = {}, {}, 3 + requests
    for r = 1, requests do
      sizes[r] = tonumber(args[3 + r])
      if not sizes[r] or sizes[r] < 0 then
        return redis.error_reply('sluice: bad size of group ' .. r)
      end
      total = total + sizes[r]
    end
    if #keys ~= total or #args ~= 3 + requests + ARGS_PER_ITEM * total then
      return redis.error_reply('sluice: group sizes do not match KEYS and ARGV')
    end
  elseif #args ~= 1 + ARGS_PER_ITEM * #keys then
    return redis.error_reply('sluice: expected 1 + ' .. ARGS_PER_ITEM .. ' * #KEYS arguments')
  end
  local first_key = 0
  for r = 1, requests do
    local n = #keys
    if batched then
      n = sizes[r]
    end
    local reply = n == 1 and decide_alone(keys[first_key + 1], args, first_arg, batched)
    if not reply then
      reply = decide_request(keys, args, first_key, first_arg, n, batched)
    end
    if not batched then
      return reply
    end
    replies[r] = reply
    first_key, first_arg = first_key + n, first_arg + ARGS_PER_ITEM * n
  end
  return replies
end
