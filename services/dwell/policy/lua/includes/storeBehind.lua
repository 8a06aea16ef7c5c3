--[[
  Included by put-6.lua, remove-7.lua and namespace_delete-7.lua (the loader,
  dwell.adapters.redis, pastes this file in place of their include line). Whether the
  store is behind `dwell.policies`: its epoch is gone (Redis lost its data) or its version
  counter is below the highest version the service has seen on the feed (Redis came back
  without its last writes). Checked in the write's own script, so that no FLUSHALL or
  failover can fall between the check and the write: a write into such a store would
  take a version lower than the feed's, and the rebuild would then drop it.

  counterKey  the version counter (dwell:policy:version)
  epochKey    the store's epoch (dwell:policy:epoch)
  floor       the highest version seen on the feed, or "" (no floor to hold)
]]
local function storeBehind(counterKey, epochKey, floor)
  if redis.call("EXISTS", epochKey) == 0 then return true end
  if floor == nil or floor == "" then return false end
  return tonumber(redis.call("GET", counterKey) or "0") < tonumber(floor)
end
