-- put: write one policy-store record under a fresh version, atomically with its checks.
--
-- KEYS[1] the version counter (dwell:policy:version)
-- KEYS[2] the parent that must exist when ARGV[1] == "1" (tenant record, namespace marker)
-- KEYS[3] the record to write
-- KEYS[4] the SET listing such records (ARGV[3] is added to it unless ARGV[3] == "")
-- KEYS[5] the scopes ZSET (scope -> version of its latest change)
-- ARGV[1] "1": the parent must exist
-- ARGV[2] "1": refuse when the record exists (create), else overwrite (set)
-- ARGV[3] member for KEYS[4], or ""
-- ARGV[4] the scope (`tenant:t`, `namespace:t/ns`, `ns:t/ns`, `topic:persistent://t/ns/x`)
-- ARGV[5] the JSON text that follows the version: `,"scope":...}`
--
-- Returns the new version (> 0), PARENT_MISSING (-1) or EXISTS (-2).
if ARGV[1] == "1" and redis.call("EXISTS", KEYS[2]) == 0 then
  return -1
end
if ARGV[2] == "1" and redis.call("EXISTS", KEYS[3]) == 1 then
  return -2
end
local version = redis.call("INCR", KEYS[1])
redis.call("SET", KEYS[3], '{"version":' .. string.format("%d", version) .. ARGV[5])
if ARGV[3] ~= "" then
  redis.call("SADD", KEYS[4], ARGV[3])
end
redis.call("ZADD", KEYS[5], version, ARGV[4])
return version
