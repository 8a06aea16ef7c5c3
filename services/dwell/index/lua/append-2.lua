--[[
  Append packed delta entries to many buckets of one topic's index in one call: the
  ingest hot path (one command per ~1,000 buckets instead of one APPEND per bucket,
  which cost more client-side than everything else in a batch).

  Input:
    KEYS[1] index ZSET       bucketStart -> bucketStart
    KEYS[2] dirty ZSET       bucketStart -> bytes of deltas waiting to be compacted
    ARGV[1] delta key prefix STRING = prefix .. bucketStart (shares KEYS[1]'s hash tag)
    ARGV[2..] bucketStart, packed entries, bucketStart, packed entries, ...

  Output:
    number of buckets appended to
]]
local prefix = ARGV[1]
local members = {}
local sizes = {}
for i = 2, #ARGV, 2 do
  local len = redis.call("APPEND", prefix .. ARGV[i], ARGV[i + 1])
  members[#members + 1] = ARGV[i]
  members[#members + 1] = ARGV[i]
  sizes[#sizes + 1] = len
  sizes[#sizes + 1] = ARGV[i]
end
if #members > 0 then
  redis.call("ZADD", KEYS[1], unpack(members))
  redis.call("ZADD", KEYS[2], unpack(sizes))
end
return #members / 2
