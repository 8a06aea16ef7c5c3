-- remove: delete one policy-store record under a fresh version (its tombstone's).
--
-- KEYS[1] the version counter (dwell:policy:version)
-- KEYS[2] the parent that must exist when ARGV[1] == "1"
-- KEYS[3] the record to delete
-- KEYS[4] a SET that must be empty when ARGV[3] == "1" (a tenant's namespaces)
-- KEYS[5] the SET listing such records (ARGV[4] is removed from it unless ARGV[4] == "")
-- KEYS[6] the scopes ZSET (scope -> version of its latest change)
-- KEYS[7] the store's epoch (dwell:policy:epoch), which must exist
-- ARGV[1] "1": the parent must exist
-- ARGV[2] the scope
-- ARGV[3] "1": refuse while KEYS[4] has members
-- ARGV[4] member for KEYS[5], or ""
-- ARGV[5] optional: the version the record must still have (see put-6.lua), or ""
-- ARGV[6] optional: the highest version seen on `dwell.policies` (see put-6.lua)
--
-- Returns the tombstone's version (> 0), ABSENT (0: nothing to remove, no version taken),
-- PARENT_MISSING (-1), NOT_EMPTY (-2), CHANGED (-3) or STORE_BEHIND (-4, see put-6.lua).
--- @include "storeBehind"
if storeBehind(KEYS[1], KEYS[7], ARGV[6]) then
  return -4
end
if ARGV[1] == "1" and redis.call("EXISTS", KEYS[2]) == 0 then
  return -1
end
if redis.call("EXISTS", KEYS[3]) == 0 then
  return 0
end
if ARGV[5] and ARGV[5] ~= "" then
  local have = string.match(redis.call("GET", KEYS[3]), '^{"version":(%d+),') or "0"
  if have ~= ARGV[5] then
    return -3
  end
end
if ARGV[3] == "1" and redis.call("SCARD", KEYS[4]) > 0 then
  return -2
end
local version = redis.call("INCR", KEYS[1])
redis.call("DEL", KEYS[3])
if ARGV[4] ~= "" then
  redis.call("SREM", KEYS[5], ARGV[4])
end
redis.call("ZADD", KEYS[6], version, ARGV[2])
return version
