-- The no-op decide code of scripts/bench/script-bound.sh: it replaces
-- src/limiter/redis/lua/decide.lua in a throwaway build, decides nothing, touches no key, and
-- answers every request with a well-formed "admitted" reply (the layout of `LIBRARY` in
-- src/limiter/redis/script.rs): unbatched {1, then per item passed 1, count 0, reset_ms 1000,
-- undo 0}; batched (ARGV[1] == BATCHED) one such reply per request. Like decide.lua, it comes
-- after the generated header, shared.lua and models.lua, and defines decide_call, which
-- library.lua registers.

local function admitted(n)
  local reply = {1}
  for i = 1, n do
    local at = REPLY_HEAD + REPLY_PER_ITEM * (i - 1)
    reply[at + REPLY_PASSED], reply[at + REPLY_COUNT] = 1, 0
    reply[at + REPLY_RESET_MS], reply[at + REPLY_UNDO] = 1000, 0
  end
  return reply
end

local function decide_call(keys, args)
  if args[1] ~= BATCHED then
    return admitted(#keys)
  end
  local replies = {}
  for r = 1, tonumber(args[3]) do
    replies[r] = admitted(tonumber(args[3 + r]))
  end
  return replies
end
