-- complete: write the store's epoch at the end of a rebuild, unless Redis lost data while
-- the rebuild ran: a FLUSHALL or a failover between two of its restores would leave the
-- store without what was restored before it, and an epoch would hide that from every
-- check. The rebuild's token, added to KEYS[1] when it began, is gone then.
--
-- KEYS[1] the SET of rebuilds under way (dwell:policy:rebuilds)
-- KEYS[2] the store's epoch (dwell:policy:epoch)
-- ARGV[1] this rebuild's token, which becomes the epoch
--
-- Returns 1 when the epoch was written, 0 when the token was gone (rebuild again).
if redis.call("SREM", KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call("SET", KEYS[2], ARGV[1])
return 1
