-- namespace_delete: delete a namespace and its own delayed-delivery policy in one step,
-- refusing while topic policies remain in it.
--
-- KEYS[1] the version counter (dwell:policy:version)
-- KEYS[2] the namespace marker
-- KEYS[3] the SET of topics in the namespace that have a topic policy
-- KEYS[4] the namespace's delayed-delivery policy
-- KEYS[5] the tenant's SET of namespaces
-- KEYS[6] the scopes ZSET
-- KEYS[7] the store's epoch (dwell:policy:epoch), which must exist
-- ARGV[1] the namespace's scope (`namespace:t/ns`)
-- ARGV[2] its policy's scope (`ns:t/ns`)
-- ARGV[3] the namespace (`t/ns`, member of KEYS[5])
-- ARGV[4] optional: the highest version seen on `dwell.policies` (see put-6.lua)
--
-- Returns {code, namespaceVersion, policyVersion}: code ABSENT (0), NOT_EMPTY (-2),
-- STORE_BEHIND (-4, see put-6.lua) or DELETED (1); policyVersion is 0 when the namespace
-- had no policy.
--- @include "storeBehind"
if storeBehind(KEYS[1], KEYS[7], ARGV[4]) then
  return {-4, 0, 0}
end
if redis.call("EXISTS", KEYS[2]) == 0 then
  return {0, 0, 0}
end
if redis.call("SCARD", KEYS[3]) > 0 then
  return {-2, 0, 0}
end
local policy_version = 0
if redis.call("EXISTS", KEYS[4]) == 1 then
  policy_version = redis.call("INCR", KEYS[1])
  redis.call("DEL", KEYS[4])
  redis.call("ZADD", KEYS[6], policy_version, ARGV[2])
end
local version = redis.call("INCR", KEYS[1])
redis.call("DEL", KEYS[2], KEYS[3])
redis.call("SREM", KEYS[5], ARGV[3])
redis.call("ZADD", KEYS[6], version, ARGV[1])
return {1, version, policy_version}
