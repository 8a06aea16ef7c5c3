--[[
  Reserve a place for a new subscription of a topic under maxSubscriptionsPerTopic, so
  that two registrations at max - 1 cannot both pass: the count and the reservation are
  one step. The registration writes Kafka, then Redis, then drops its reservation; one
  that fails drops it at once, one that dies leaves it to expire.

  Input:
    KEYS[1] subscriptions HASH   subscription -> settings JSON (the registry)
    KEYS[2] reservations ZSET    subscription -> expiry (ms) of its reservation
    ARGV[1] the subscription
    ARGV[2] the maximum (> 0)
    ARGV[3] now (ms)
    ARGV[4] how long a reservation lasts (ms)

  Output: 1 when the subscription exists or has its place, 0 when the topic is full.
]]
if redis.call("HEXISTS", KEYS[1], ARGV[1]) == 1 then
  return 1
end
redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", ARGV[3])
if redis.call("ZSCORE", KEYS[2], ARGV[1]) then
  return 1
end
if redis.call("HLEN", KEYS[1]) + redis.call("ZCARD", KEYS[2]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call("ZADD", KEYS[2], tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[1])
redis.call("PEXPIRE", KEYS[2], ARGV[4])
return 1
