-- luacheck settings for the Lua that sluice runs inside Redis (scripts/ci/lua-lint.sh runs it).

-- Redis embeds Lua 5.1.
std = "lua51"
max_line_length = 100
-- What Redis gives every script.
read_globals = {"redis", "KEYS", "ARGV"}

-- Each script is assembled by src/limiter/redis/script.rs: the header it generates from its Rust
-- constants, shared.lua, then its own files (models.lua, decide.lua and library.lua, or
-- compensate.lua; in the no-op build of scripts/bench/script-bound.sh, script-bound-noop.lua
-- takes decide.lua's place). luacheck reads one file at a time, so each file is told what the
-- parts before it define, as read-only globals, and a part that defines names for the parts
-- after it that those names are not unused.

-- The header's names, read from script.rs as scripts/bench/assemble-script.py reads them: each
-- `NAME: type = value;` line of its `shared_with_lua!` block (a unit test of script.rs holds
-- this reading to the generated header). Paths are relative to the repository's root, where
-- scripts/ci/lua-lint.sh runs luacheck.
local function header_names(path)
  local file = assert(io.open(path), ".luacheckrc: cannot read " .. path)
  local source = file:read("*a")
  file:close()
  local block = assert(source:match("\nshared_with_lua! {\n(.-)\n}\n"),
    ".luacheckrc: no shared_with_lua! block in " .. path)
  local names = {}
  for name in ("\n" .. block):gmatch("\n%s*([A-Z_]+): ") do names[#names + 1] = name end
  assert(#names > 0, ".luacheckrc: no constant in the shared_with_lua! block of " .. path)
  return names
end

local header = header_names("src/limiter/redis/script.rs")
local shared = {
  "LOG_MEMBERS", "TOKEN_MEMBER", "TOKEN_SCORE", "MEMBERS_PER_COMMAND", "format_number",
  "format_integer", "start_call", "floor_div", "encode_value", "decode_value", "read_clock",
  "log_member", "parse_log_member", "store_log_total",
}
local models = {"make_models"}
local decide = {"decide_call"}

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
-- now_ms (shared.lua) is the call's clock: decide.lua and compensate.lua set it, models.lua
-- reads it.
local clock = {"now_ms"}
files[lua .. "shared.lua"] = {read_globals = header, ignore = exported(concat(shared, clock))}
files[lua .. "models.lua"] = {read_globals = concat(header, shared, clock),
  ignore = exported(models)}
files[lua .. "decide.lua"] = {read_globals = concat(header, shared, models), globals = clock,
  ignore = exported(decide)}
-- library.lua also reads the function's name, a line script.rs puts before the header.
files[lua .. "library.lua"] = {read_globals = concat({"DECIDE_FUNCTION"}, header, shared, models,
  decide)}
files[lua .. "compensate.lua"] = {read_globals = concat(header, shared), globals = clock}
files["scripts/bench/script-bound-noop.lua"] = {read_globals = concat(header, shared, models),
  ignore = exported(decide)}
files["scripts/bench/minimal-log.lua"] = {}
