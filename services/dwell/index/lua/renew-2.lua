--[[
  Renew (extend) the leases a drainer still holds on claimed buckets of one index, so
  that a round running longer than its lease keeps its buckets: another drainer's claim
  (claim-6.lua) takes back only claims whose expiry has passed.

  A claim is held while the leases HASH names this lease id for its bucket. A lease
  past its expiry that nobody has claimed since is still held (claim-6.lua hands a
  claim out again, and clears its lease id, in the same script that takes it back), so
  renewing it is safe. A renewal never shortens a lease (ZADD GT) and never creates a
  claim (ZADD XX): a completed bucket stays completed. Bucket membership does not
  change, so the due hint (updateDueHint) stays as it is.

  Input:
    KEYS[1] claims ZSET      bucketStart -> lease expiry (ms)
    KEYS[2] leases HASH      bucketStart -> lease id
    ARGV[1] lease id
    ARGV[2] new lease expiry (ms)
    ARGV[3..] bucketStarts claimed under the lease

  Output: one code per bucketStart of ARGV[3..], in order:
     1  RENEWED              held, its expiry moved to ARGV[2] (or later already)
     0  NOT_CLAIMED          no claim on the bucket (completed, or taken back into the
                             index by a claim after the lease expired)
    -1  LEASE_MISMATCH       another lease holds the bucket now
]]
local out = {}
for i = 3, #ARGV do
  local b = ARGV[i]
  local holder = redis.call("HGET", KEYS[2], b)
  if not holder then
    out[#out + 1] = 0
  elseif holder ~= ARGV[1] then
    out[#out + 1] = -1
  else
    redis.call("ZADD", KEYS[1], "XX", "GT", ARGV[2], b)
    out[#out + 1] = 1
  end
end
return out
