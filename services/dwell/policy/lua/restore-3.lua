-- restore: put back one scope's record as `dwell.policies` carries it, unless the store
-- already holds that version or a later one (a write that landed meanwhile wins).
--
-- KEYS[1] the scopes ZSET (scope -> version of its latest change)
-- KEYS[2] the scope's record
-- KEYS[3] the SET listing such records (tenants, a tenant's namespaces, a namespace's
--         topics with a policy); unused when ARGV[4] == ""
-- ARGV[1] the scope
-- ARGV[2] its version on the feed
-- ARGV[3] the record JSON, or "" for a tombstone (the scope was removed)
-- ARGV[4] member for KEYS[3], or ""
--
-- Returns 1 when the record was put back (or removed), 0 when the store was newer.
local current = redis.call("ZSCORE", KEYS[1], ARGV[1])
if current and tonumber(current) >= tonumber(ARGV[2]) then
  return 0
end
if ARGV[3] == "" then
  redis.call("DEL", KEYS[2])
  if ARGV[4] ~= "" then redis.call("SREM", KEYS[3], ARGV[4]) end
else
  redis.call("SET", KEYS[2], ARGV[3])
  if ARGV[4] ~= "" then redis.call("SADD", KEYS[3], ARGV[4]) end
end
redis.call("ZADD", KEYS[1], ARGV[2], ARGV[1])
return 1
