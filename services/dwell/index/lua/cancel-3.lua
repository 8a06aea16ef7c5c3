--[[
  Cancel one pending delayed message of a topic: its origin position (the one its
  messageId names) goes into the topic's cancellations, which the drain leaves out of
  every round that claims the message's bucket. Atomic against the drain's claim
  (claim-5.lua), whose lease it checks: a message answered "cancelled" is never copied.

  Input:
    KEYS[1] index ZSET          bucketStart -> bucketStart (live buckets)
    KEYS[2] leases HASH         bucketStart -> lease id (claimed buckets)
    KEYS[3] cancellations ZSET  "<partition>:<offset>" -> bucketStart
    ARGV[1] bucketStart         the message's bucket; (sweep) the latest bucket to look at
    ARGV[2] member              "<partition>:<offset>" of dwell.delayed; (sweep) how many
                                cancellations to look at, at most
    ARGV[3] mode                "answer": a request (the tracker's API), answered by the
                                rules below; "sweep": drop the cancellations of buckets up
                                to ARGV[1] that hold nothing, live or claimed (a rebuild
                                puts back every cancellation it finds, delivered or not)
    ARGV[4] due cutoff          (answer) the largest bucketStart that may be drained now,
                                with a margin for the drainers' clocks

  Output (answer):
     1  CANCELLED      kept (or already kept: a retried request)
     0  DELIVERED      the bucket is due and holds nothing any more
    -1  TOO_LATE       the bucket is due and held or claimed: it is being delivered
    -2  BUSY           the bucket is claimed while not due (the tracker re-files it)
  Output (sweep): cancellations dropped
]]
local b = ARGV[1]
if ARGV[3] == "sweep" then
  local rows = redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", b, "WITHSCORES", "LIMIT", 0,
                          tonumber(ARGV[2]))
  local dropped = 0
  for i = 1, #rows, 2 do
    local bucket = rows[i + 1]
    if not redis.call("ZSCORE", KEYS[1], bucket) and
        redis.call("HEXISTS", KEYS[2], bucket) == 0 then
      redis.call("ZREM", KEYS[3], rows[i])
      dropped = dropped + 1
    end
  end
  return dropped
end
if redis.call("ZSCORE", KEYS[3], ARGV[2]) then return 1 end
local due = tonumber(b) <= tonumber(ARGV[4])
if redis.call("HEXISTS", KEYS[2], b) == 1 then
  if due then return -1 end
  return -2
end
if due then
  if redis.call("ZSCORE", KEYS[1], b) then return -1 end
  return 0
end
-- Not due and not claimed: whatever of the bucket is pending (live, or a re-filed copy
-- on its way to the index) has not been delivered.
redis.call("ZADD", KEYS[3], b, ARGV[2])
return 1
