--[[
  Move the backoff's applied marker of one dwell.acks partition up to ARGV[2], only while
  the marker exists (only a rebuild creates it: a Redis that lost it must still show the
  loss) and never down (a replayed batch).

  Input:
    KEYS[1] HASH    partition -> offset (keys.BACKOFF_APPLIED)
    ARGV[1] partition
    ARGV[2] offset
  Output: 1 moved, 0 the marker is missing, -1 it was there or beyond
]]
if redis.call("EXISTS", KEYS[1]) == 0 then return 0 end
local cur = redis.call("HGET", KEYS[1], ARGV[1])
if cur and tonumber(cur) >= tonumber(ARGV[2]) then return -1 end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[2])
return 1
