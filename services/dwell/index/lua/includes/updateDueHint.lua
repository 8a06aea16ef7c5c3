--[[
  Included by claim-6.lua and complete-7.lua (the loader, dwell.adapters.redis, pastes
  this file in place of their include line). Recompute an index's due hint: its member in the global due
  ZSET scores the earliest bucketStart that holds messages (live in the index) or an
  outstanding claim; with neither, the member goes.

  indexKey   index ZSET   bucketStart -> bucketStart
  claimsKey  claims ZSET  bucketStart -> lease expiry
  dueKey     due ZSET     `dwell:due` or `dwell:due:subs`
  member     the index's member in dueKey ("" = do not maintain dueKey)
]]
local function updateDueHint(indexKey, claimsKey, dueKey, member)
  if member == "" then return end
  local first = redis.call("ZRANGE", indexKey, 0, 0, "WITHSCORES")
  local low = first[2]
  for _, b in ipairs(redis.call("ZRANGE", claimsKey, 0, -1)) do
    if low == nil or tonumber(b) < tonumber(low) then low = b end
  end
  if low == nil then
    redis.call("ZREM", dueKey, member)
  else
    redis.call("ZADD", dueKey, low, member)
  end
end
