--[[
  Complete a claimed bucket: delete its claimed data once the drainer has written
  its messages durably. Only the lease holder may complete.

  Input:
    KEYS[1] claims ZSET      bucketStart -> lease expiry
    KEYS[2] leases HASH      bucketStart -> lease id
    KEYS[3] claimed LIST     the bucket's claimed blobs
    KEYS[4] claimed delta STRING
    KEYS[5] index ZSET       (to recompute the due hint)
    KEYS[6] due ZSET         global `dwell:due` (outside the hash-tag slot)
    KEYS[7] changes STREAM   gets an entry `b` = bucketStart (as append-3.lua writes)
    ARGV[1] bucketStart
    ARGV[2] lease id
    ARGV[3] due member       "" = do not maintain KEYS[6]
    ARGV[4] entries the changes stream keeps, about; "0" = no entry (an index nobody
            reads the changes of)

  Output:
     1  COMPLETED
     0  NOT_CLAIMED          no claim on this bucket (already completed?)
    -1  LEASE_MISMATCH       the claim belongs to another lease (ours expired and was
                             re-claimed): do not treat the bucket as yours
]]
--- @include "updateDueHint"

local holder = redis.call("HGET", KEYS[2], ARGV[1])
if not holder then return 0 end
if holder ~= ARGV[2] then return -1 end
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("HDEL", KEYS[2], ARGV[1])
redis.call("DEL", KEYS[3], KEYS[4])
if ARGV[4] ~= "0" then
  redis.call("XADD", KEYS[7], "MAXLEN", "~", ARGV[4], "*", "b", ARGV[1])
end
updateDueHint(KEYS[5], KEYS[1], KEYS[6], ARGV[3])
return 1
