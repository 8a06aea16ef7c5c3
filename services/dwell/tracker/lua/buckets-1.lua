--[[
  What the tracker's index view (dwell.tracker.index_view.read_buckets) reads of some
  buckets of one topic's index, each bucket at once: its live blobs (HASH) and deltas
  (STRING), its claimed blobs (LIST) and claimed deltas (STRING), their bytes, and whether
  its deltas wait for compaction. One call for many buckets: read one command at a time,
  the client's cost per command was most of a read.

  Input:
    KEYS[1] dirty ZSET       bucketStart -> delta bytes; every key read here shares its
                             hash tag
    ARGV[1] bucket key prefix          live HASH  = prefix .. bucketStart
    ARGV[2] delta key prefix           live STRING
    ARGV[3] claimed key prefix         LIST field, blob, field, blob...
    ARGV[4] claimed delta key prefix   STRING
    ARGV[5..] bucket starts

  Output:
    per bucket, in order: {flat HASH field, blob..., delta or "", flat claimed LIST,
    claimed delta or "", MEMORY USAGE (all samples) of the four keys summed,
    1 when the bucket is in KEYS[1] else 0}
]]
local out = {}
for i = 5, #ARGV do
  local b = ARGV[i]
  local bytes = 0
  for p = 1, 4 do
    bytes = bytes + (redis.call("MEMORY", "USAGE", ARGV[p] .. b, "SAMPLES", "0") or 0)
  end
  out[#out + 1] = {
    redis.call("HGETALL", ARGV[1] .. b),
    redis.call("GET", ARGV[2] .. b) or "",
    redis.call("LRANGE", ARGV[3] .. b, 0, -1),
    redis.call("GET", ARGV[4] .. b) or "",
    bytes,
    redis.call("ZSCORE", KEYS[1], b) and 1 or 0,
  }
end
return out
