--[[
  Delete the pending entries of messages whose redelivery the drain claimed: each
  messageId's entry goes only if it is still the one in the claimed bucket (a later
  event may have scheduled the message again meanwhile, into another bucket).

  Input:
    KEYS[1] HASH    messageId -> "dueAt,bucket,storedCount" (keys.sub_pending)
    ARGV[1] the claimed bucket's start
    ARGV[2..] messageIds
  Output: how many entries were deleted
]]
local deleted = 0
local bucket = tostring(ARGV[1])
for i = 2, #ARGV do
  local v = redis.call("HGET", KEYS[1], ARGV[i])
  if v then
    local b = string.match(v, "^[^,]*,([^,]*),")
    if b == bucket then
      redis.call("HDEL", KEYS[1], ARGV[i])
      deleted = deleted + 1
    end
  end
end
return deleted
