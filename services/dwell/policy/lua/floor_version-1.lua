-- floor_version: raise the version counter to at least ARGV[1], never lower it, so that
-- versions keep increasing past what the change feed already carries (e.g. after Redis
-- lost its data).
--
-- KEYS[1] the version counter (dwell:policy:version)
-- ARGV[1] the highest version seen on the feed
--
-- Returns the counter's value afterwards.
local current = tonumber(redis.call("GET", KEYS[1]) or "0")
local floor = tonumber(ARGV[1])
if current < floor then
  redis.call("SET", KEYS[1], ARGV[1])
  return floor
end
return current
