--[[
  Write a bucket's merged blobs, compare-and-set: only when the live bucket and its
  deltas still hold exactly what the caller read (compared by SHA-1), so a claim or
  another writer in between makes the caller re-read instead of losing data.
  Used by compaction (blobs := blobs ∪ deltas, deltas dropped) and by direct adds
  (subscription redelivery indexes).

  Input:
    KEYS[1] bucket HASH      field -> blob
    KEYS[2] delta STRING
    KEYS[3] index ZSET
    KEYS[4] dirty ZSET       bucketStart -> bytes of deltas waiting to be compacted
    ARGV[1] bucketStart
    ARGV[2] sha1 of the delta as read ("" when absent)
    ARGV[3] sha1 of the bucket as read: fields sorted bytewise, each
            field .. ":" .. #blob .. ":" .. blob, concatenated
    ARGV[4..] field, blob, field, blob ... to HSET

  Output:
     1  MERGED
     0  CHANGED              the bucket or its deltas changed since read: retry
]]
local d = redis.call("GET", KEYS[2]) or ""
if redis.sha1hex(d) ~= ARGV[2] then return 0 end
local flat = redis.call("HGETALL", KEYS[1])
local pairs_ = {}
for i = 1, #flat, 2 do pairs_[#pairs_ + 1] = {flat[i], flat[i + 1]} end
table.sort(pairs_, function(a, b) return a[1] < b[1] end)
local parts = {}
for _, p in ipairs(pairs_) do parts[#parts + 1] = p[1] .. ":" .. #p[2] .. ":" .. p[2] end
if redis.sha1hex(table.concat(parts)) ~= ARGV[3] then return 0 end
if #ARGV > 3 then
  redis.call("HSET", KEYS[1], unpack(ARGV, 4))
  redis.call("ZADD", KEYS[3], ARGV[1], ARGV[1])
end
redis.call("DEL", KEYS[2])
redis.call("ZREM", KEYS[4], ARGV[1])
return 1
