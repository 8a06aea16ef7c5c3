-- put: write one policy-store record under a fresh version, atomically with its checks.
--
-- KEYS[1] the version counter (dwell:policy:version)
-- KEYS[2] the parent that must exist when ARGV[1] == "1" (tenant record, namespace marker)
-- KEYS[3] the record to write
-- KEYS[4] the SET listing such records (ARGV[3] is added to it unless ARGV[3] == "")
-- KEYS[5] the scopes ZSET (scope -> version of its latest change)
-- KEYS[6] the store's epoch (dwell:policy:epoch), which must exist
-- ARGV[1] "1": the parent must exist
-- ARGV[2] "1": refuse when the record exists (create), else overwrite (set)
-- ARGV[3] member for KEYS[4], or ""
-- ARGV[4] the scope (`tenant:t`, `namespace:t/ns`, `ns:t/ns`, `topic:persistent://t/ns/x`)
-- ARGV[5] the JSON text that follows the version: `,"scope":...}`
-- ARGV[6] optional: the version the record must still have ("0": absent), for a write
--         computed from the record as it was read (a topic's local and global policies)
-- ARGV[7] optional: the highest version seen on `dwell.policies`; KEYS[1] must not be
--         below it
--
-- Returns the new version (> 0), PARENT_MISSING (-1), EXISTS (-2), CHANGED (-3: the
-- record is no longer at ARGV[6]) or STORE_BEHIND (-4: no epoch, or the counter below
-- ARGV[7]; checked first, since every other answer would come from a store that lost
-- data).
--- @include "storeBehind"
if storeBehind(KEYS[1], KEYS[6], ARGV[7]) then
  return -4
end
if ARGV[1] == "1" and redis.call("EXISTS", KEYS[2]) == 0 then
  return -1
end
if ARGV[2] == "1" and redis.call("EXISTS", KEYS[3]) == 1 then
  return -2
end
if ARGV[6] and ARGV[6] ~= "" then
  local current = redis.call("GET", KEYS[3])
  local have = current and string.match(current, '^{"version":(%d+),') or "0"
  if have ~= ARGV[6] then
    return -3
  end
end
local version = redis.call("INCR", KEYS[1])
redis.call("SET", KEYS[3], '{"version":' .. string.format("%d", version) .. ARGV[5])
if ARGV[3] ~= "" then
  redis.call("SADD", KEYS[4], ARGV[3])
end
redis.call("ZADD", KEYS[5], version, ARGV[4])
return version
