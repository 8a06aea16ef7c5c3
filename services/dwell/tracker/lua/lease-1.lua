--[[
  Take, keep or give up the tracker's bookkeeping lease (dwell:trk:bookkeeper): set it to
  this replica's id when no replica holds it, extend it when this replica does; with a
  length of 0, delete it if this replica holds it. A holder's id without an expiry (not
  one this script set: written by hand, or restored without its TTL) holds nothing: it
  would keep every replica from the lease for good, so it is taken over.

  Input:
    KEYS[1] lease STRING   the holder's id, expiring
    ARGV[1] this replica's id
    ARGV[2] how long the lease lasts from now, ms (0: give it up)

  Output: 1 when this replica holds the lease for ARGV[2] ms from now, 0 otherwise.
]]
local holder = redis.call("GET", KEYS[1])
if ARGV[2] == "0" then
  if holder == ARGV[1] then
    redis.call("DEL", KEYS[1])
  end
  return 0
end
if holder == false or (holder ~= ARGV[1] and redis.call("PTTL", KEYS[1]) == -1) then
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return 1
end
return 0
