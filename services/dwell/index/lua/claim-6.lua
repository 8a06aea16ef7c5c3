--[[
  Claim up to N due buckets of one index (a topic's, or one subscription's
  redeliveries) for draining, atomically: two callers never get the same bucket.

  An expired claim (lease expiry <= now) first returns to the index; its data
  stays in the claimed keys and is handed out again with whatever arrived since.
  A bucket still claimed under a lease that has not expired (its holder may be renewing
  it, renew-2.lua) is skipped even when positions arrived for it since: they wait in the
  live keys until the holder completes, so that no claim takes over another's data.
  Each claimed bucket's live blobs (HASH) and deltas (STRING) are MOVED to
  per-bucket claimed keys, so messages indexed after the claim start a fresh
  live bucket and are never deleted by `complete`.

  Input:
    KEYS[1] index ZSET       bucketStart -> bucketStart
    KEYS[2] claims ZSET      bucketStart -> lease expiry (ms)
    KEYS[3] leases HASH      bucketStart -> lease id
    KEYS[4] dirty ZSET       bucketStart -> bytes of deltas waiting to be compacted
    KEYS[5] due ZSET         global `dwell:due` (member ARGV[6]); the one key outside
                             the index's hash-tag slot (not Redis-Cluster safe)
    KEYS[6] changes STREAM   gets an entry `b` = the buckets claimed, comma-separated (as
                             append-3.lua writes): their data moved to other keys
    ARGV[1] cutoff           largest due bucketStart
    ARGV[2] max buckets
    ARGV[3] lease id
    ARGV[4] lease expiry (ms)
    ARGV[5] now (ms)
    ARGV[6] due member       topic (or "<topic> <sub>"); "" = do not maintain KEYS[5]
    ARGV[7] bucket key prefix          live HASH  = prefix .. bucketStart
    ARGV[8] delta key prefix           live STRING
    ARGV[9] claimed key prefix         LIST field, blob, field, blob...
    ARGV[10] claimed delta key prefix  STRING
    ARGV[11] entries the changes stream keeps, about; "0" = no entry (an index nobody
             reads the changes of)
    ARGV[12] smallest bucketStart to claim (optional, default -inf): the tracker's
             restage claims a chunk of future buckets (ARGV 12 to ARGV 1)
    All dynamically named keys share KEYS[1]'s hash tag.

  Output:
    array of {bucketStart, {field, blob, ...}, deltas or false}, earliest first
]]
--- @include "updateDueHint"

local expired = redis.call("ZRANGEBYSCORE", KEYS[2], "-inf", ARGV[5])
for _, b in ipairs(expired) do
  redis.call("ZREM", KEYS[2], b)
  redis.call("HDEL", KEYS[3], b)
  redis.call("ZADD", KEYS[1], b, b)
end

local due = redis.call("ZRANGEBYSCORE", KEYS[1], ARGV[12] or "-inf", ARGV[1], "LIMIT", 0,
                      tonumber(ARGV[2]))
local out = {}
local claimedStarts = {}
for _, b in ipairs(due) do
  -- A bucket held under a lease that has not expired is skipped (see the header).
  if redis.call("HEXISTS", KEYS[3], b) == 0 then
    local live = ARGV[7] .. b
    local delta = ARGV[8] .. b
    local claimed = ARGV[9] .. b
    local claimedDelta = ARGV[10] .. b
    local fields = redis.call("HGETALL", live)
    if #fields > 0 then
      redis.call("RPUSH", claimed, unpack(fields))
      redis.call("DEL", live)
    end
    local d = redis.call("GET", delta)
    if d then
      redis.call("APPEND", claimedDelta, d)
      redis.call("DEL", delta)
    end
    redis.call("ZREM", KEYS[4], b)
    redis.call("ZREM", KEYS[1], b)
    redis.call("ZADD", KEYS[2], ARGV[4], b)
    redis.call("HSET", KEYS[3], b, ARGV[3])
    out[#out + 1] = {b, redis.call("LRANGE", claimed, 0, -1), redis.call("GET", claimedDelta)}
    claimedStarts[#claimedStarts + 1] = b
  end
end
if #claimedStarts > 0 and ARGV[11] ~= "0" then
  redis.call("XADD", KEYS[6], "MAXLEN", "~", ARGV[11], "*", "b", table.concat(claimedStarts, ","))
end

updateDueHint(KEYS[1], KEYS[2], KEYS[5], ARGV[6])
return out
