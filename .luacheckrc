-- luacheck settings for the Lua that sluice runs inside Redis (scripts/ci/lua-lint.sh runs it).

-- Redis embeds Lua 5.1.
std = "lua51"
max_line_length = 100
-- What Redis gives every script.
read_globals = {"redis", "KEYS", "ARGV"}

-- Each script is assembled by src/limiter/redis/script.rs: the header it generates from its Rust
-- constants, shared.lua, then the script's own files (models.lua and decide.lua, or
-- compensate.lua; in the no-op build of scripts/bench/script-bound.sh, script-bound-noop.lua
-- takes decide.lua's place). luacheck reads one file at a time, so each file is told what the parts
-- before it define, as read-only globals, and a part that defines names for the parts after it
-- that those names are not unused. A unit test of script.rs keeps `header` equal to the
-- generated header.
local header = {
  "ARGS_PER_ITEM", "UNDO_ARGS_PER_KEY", "MAX_EXACT", "LOG_MEMBER_FIRST", "LOG_MEMBER_LAST",
  "LOG_TOTAL_MEMBER", "BATCHED", "KIND_CONSUME", "KIND_SHADOW", "KIND_REFUND", "KIND_QUOTA",
  "ALGORITHM_SLIDING_LOG", "ALGORITHM_QUANTIZED_LOG", "ALGORITHM_SLIDING_COUNTER",
  "ALGORITHM_GCRA", "ALGORITHM_FIXED_WINDOW", "ALGORITHM_IN_FLIGHT", "OVER_LIMIT_REFUSE",
  "OVER_LIMIT_FILL", "OVER_LIMIT_RECORD",
}
local shared = {
  "LOG_MEMBERS", "TOKEN_MEMBER", "TOKEN_SCORE", "MEMBERS_PER_COMMAND", "format_number",
  "format_integer", "floor_div", "encode_value", "decode_value", "read_clock",
  "log_member", "parse_log_member", "store_log_total",
}
local models = {"make_models"}

local function concat(...)
  local all = {}
  for _, names in ipairs({...}) do
    for _, name in ipairs(names) do all[#all + 1] = name end
  end
  return all
end

-- Definitions that only the files after their own use: "unused" there by design, and only those.
local function exported(names)
  local patterns = {}
  for _, name in ipairs(names) do patterns[#patterns + 1] = "211/" .. name end
  return patterns
end

local lua = "src/limiter/redis/lua/"
files[lua .. "shared.lua"] = {read_globals = header, ignore = exported(shared)}
files[lua .. "models.lua"] = {read_globals = concat(header, shared), ignore = exported(models)}
files[lua .. "decide.lua"] = {read_globals = concat(header, shared, models)}
files[lua .. "compensate.lua"] = {read_globals = concat(header, shared)}
files["scripts/bench/script-bound-noop.lua"] = {read_globals = concat(header, shared, models)}
