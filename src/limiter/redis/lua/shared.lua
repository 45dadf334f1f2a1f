-- What both scripts share: number printing, the form of a log entry and of a log's total, the
-- undo token of a log entry, and the one-value form of the O(1) algorithms' state.
--
-- Every script is assembled by src/limiter/redis/script.rs: the layout header it generates from
-- its Rust constants (ARGS_PER_ITEM, UNDO_ARGS_PER_KEY, MAX_EXACT, LOG_MEMBER_FIRST,
-- LOG_MEMBER_LAST, LOG_TOTAL_MEMBER, BATCHED, the KIND_*, ALGORITHM_* and OVER_LIMIT_* codes),
-- then this file, then the script's own files (models.lua, decide.lua and library.lua for the
-- decide library, compensate.lua for the compensation script). KEYS, ARGV and the replies are
-- documented once, on `LIBRARY` and `COMPENSATE` in script.rs.
--
-- The top level of these files runs once when Redis loads the library (FUNCTION LOAD), where
-- Redis gives it no global but `redis.register_function` and `redis.log`: it only defines
-- locals and functions, and anything that needs a global runs in a call (start_call).

-- The clock of the call being run (read_clock), which each call sets first: one call runs at a
-- time, and the functions of the files after this one read it.
local now_ms = 0

-- How many member numbers a sliding log cycles through (see log_add in decide.lua).
local LOG_MEMBERS = LOG_MEMBER_LAST - LOG_MEMBER_FIRST + 1
-- Digits of a member number (LOG_MEMBER_FIRST and LOG_MEMBER_LAST have as many), counted
-- without `string`, which a library's load does not have.
local LOG_NUMBER_DIGITS = 1
while 10 ^ LOG_NUMBER_DIGITS <= LOG_MEMBER_FIRST do
  LOG_NUMBER_DIGITS = LOG_NUMBER_DIGITS + 1
end

-- The undo token of a sliding log item (log_add in decide.lua): its score modulo
-- TOKEN_SCORE and its first member, below 2^53 together.
local TOKEN_MEMBER, TOKEN_SCORE = 8388608, 1073741824

-- Members per ZADD (two arguments each) or ZMSCORE, far below Lua's `unpack` limit.
local MEMBERS_PER_COMMAND = 1000

-- Decimal digits of a number below 2^53, for arguments Redis reads as integers (TTLs, counts,
-- hash fields); a fraction is rounded.
local function format_number(x)
  return string.format('%.0f', x)
end

-- The same for a number known to be an integer (times in ms, log members, TTLs derived from
-- them), for less: '%d' prints through the C library's integer path where '%.0f' goes through
-- its floating-point one, and so does Redis 7.0 itself ('%.17g') for a Lua number handed to
-- `redis.call`. Callers guarantee integrality (the clock and the windows are checked), since
-- '%d' would truncate a fraction. Lua's '%d' goes through a C `long`: 64 bits wherever Redis
-- runs in production, but 32 on a 32-bit build, where a time in ms would wrap; such a server
-- keeps '%.0f'. Chosen by the first call (start_call), with the format of a weighted log
-- member (two integers, log_member).
local INTEGER_FORMAT, MEMBER_FORMAT = false, false
local function format_integer(x)
  return string.format(INTEGER_FORMAT, x)
end

-- What every call does first: the choice of INTEGER_FORMAT, once per load of the library (or
-- per call of a script).
local function start_call()
  if not INTEGER_FORMAT then
    INTEGER_FORMAT = '%.0f'
    if string.format('%d', 1099511627776) == '1099511627776' then
      INTEGER_FORMAT = '%d'
    end
    MEMBER_FORMAT = INTEGER_FORMAT .. INTEGER_FORMAT
  end
end

-- The clock of a call, from its clock argument: Redis TIME for the empty string (production:
-- every sidecar then uses the same clock, however skewed their hosts are), else an explicit
-- whole number of ms (tests); nil when malformed (a fraction: times are printed as integers).
local function read_clock(argument)
  if argument == '' then
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  local ms = tonumber(argument)
  if not ms or ms % 1 ~= 0 then
    return nil
  end
  return ms
end

-- The member of a log entry: its number, then its weight unless that is 1 (log_add in
-- decide.lua).
local function log_member(number, weight)
  if weight == 1 then
    return format_integer(number)
  end
  return string.format(MEMBER_FORMAT, number, weight)
end

-- The number and weight of a log entry's member, as Redis returns it.
local function parse_log_member(member)
  if #member == LOG_NUMBER_DIGITS then
    return tonumber(member), 1
  end
  return tonumber(string.sub(member, 1, LOG_NUMBER_DIGITS)),
    tonumber(string.sub(member, LOG_NUMBER_DIGITS + 1))
end

-- Stores a log key's total (the sum of its entries' weights) beside its entries: the score of
-- LOG_TOTAL_MEMBER, negated, so that the member sorts first, below every entry (a change of its
-- score then costs Redis no scan of the set). A key whose total is 0 holds no entry and is
-- deleted.
local function store_log_total(key, total)
  if total > 0 then
    redis.call('ZADD', key, format_integer(-total), LOG_TOTAL_MEMBER)
  else
    redis.call('DEL', key)
  end
end

-- floor(a / b) for integers below 2^53, exact whatever the rounding of the division.
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

-- An O(1) state stored as one decimal integer, so that Redis keeps it inside its 16-byte object
-- instead of a separate allocation: the width digit D (1-9), each count zero-padded to D digits,
-- then the time field, unpadded. `second` is nil for a state of one count. Counts of more than 9
-- digits take the form `n<first>[:<second>]:<time>`. Composed and split as strings (Lua numbers
-- are doubles); a value past 19 digits is stored all the same, as a string.
local function encode_value(time, first, second)
  local widest = first
  if second and second > widest then
    widest = second
  end
  local digits, bound = 1, 10
  while widest >= bound and digits < 10 do
    digits, bound = digits + 1, bound * 10
  end
  if digits > 9 then
    if second then
      return 'n' .. format_number(first) .. ':' .. format_number(second) .. ':'
        .. format_number(time)
    end
    return 'n' .. format_number(first) .. ':' .. format_number(time)
  end
  local count = '%0' .. digits .. '.0f'
  if second then
    return string.format(digits .. count .. count .. '%.0f', first, second, time)
  end
  return string.format(digits .. count .. '%.0f', first, time)
end

-- The counts and time of a value encode_value made with `counts` (1 or 2) counts: first,
-- second (0 for a state of one count), time. Anything unreadable reads as 0.
local function decode_value(value, counts)
  if string.sub(value, 1, 1) == 'n' then
    local fields = {}
    for field in string.gmatch(string.sub(value, 2), '[^:]+') do
      fields[#fields + 1] = tonumber(field)
    end
    if counts == 1 then
      return fields[1] or 0, 0, fields[2] or 0
    end
    return fields[1] or 0, fields[2] or 0, fields[3] or 0
  end
  local digits = tonumber(string.sub(value, 1, 1)) or 1
  local first = tonumber(string.sub(value, 2, 1 + digits)) or 0
  local second = 0
  if counts == 2 then
    second = tonumber(string.sub(value, 2 + digits, 1 + 2 * digits)) or 0
  end
  return first, second, tonumber(string.sub(value, 2 + counts * digits)) or 0
end
