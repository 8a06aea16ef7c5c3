--[[
  Append packed delta entries to many buckets of one topic's index in one call: the
  ingest hot path (one command per ~1,000 buckets instead of one APPEND per bucket,
  which cost more client-side than everything else in a batch).

  Input:
    KEYS[1] index ZSET       bucketStart -> bucketStart
    KEYS[2] dirty ZSET       bucketStart -> bytes of deltas waiting to be compacted
    KEYS[3] changes STREAM   one entry per call, `b` = the bucket starts appended to,
                             comma-separated (dwell.tracker.index_view reads it)
    ARGV[1] delta key prefix STRING = prefix .. bucketStart (shares KEYS[1]'s hash tag)
    ARGV[2] entries the changes stream keeps, about (XADD MAXLEN ~)
    ARGV[3..] bucketStart, packed entries, bucketStart, packed entries, ...

  Output:
    number of buckets appended to
]]
local prefix = ARGV[1]
local members = {}
local sizes = {}
for i = 3, #ARGV, 2 do
  local len = redis.call("APPEND", prefix .. ARGV[i], ARGV[i + 1])
  members[#members + 1] = ARGV[i]
  members[#members + 1] = ARGV[i]
  sizes[#sizes + 1] = len
  sizes[#sizes + 1] = ARGV[i]
end
if #members > 0 then
  redis.call("ZADD", KEYS[1], unpack(members))
  redis.call("ZADD", KEYS[2], unpack(sizes))
  local starts = {}
  for i = 1, #members, 2 do starts[#starts + 1] = members[i] end
  redis.call("XADD", KEYS[3], "MAXLEN", "~", ARGV[2], "*", "b", table.concat(starts, ","))
end
return #members / 2
