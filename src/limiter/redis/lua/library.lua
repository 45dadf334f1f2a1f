-- Registers decide_call (decide.lua) as the decide library's function, under the name that
-- src/limiter/redis/script.rs gives it (DECIDE_FUNCTION, a line it puts before the header: the
-- name carries a hash of the library's code, so that two versions of sluice sharing a Redis
-- during a rolling upgrade each call their own). No flags, as for a script declared without
-- any: an out-of-memory Redis refuses the whole call before any command of it runs
-- (docs/redis.md, "Redis out of memory").
redis.register_function{function_name = DECIDE_FUNCTION, callback = decide_call}
