--[[
  Raise a counter to ARGV[1] unless it is already there or beyond (a topic's last
  re-filed chunk: two tracker replicas may finish chunks out of order).

  Input:
    KEYS[1] STRING   the counter
    ARGV[1] value
  Output: 1 raised, 0 left as it was
]]
local cur = redis.call("GET", KEYS[1])
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call("SET", KEYS[1], ARGV[1])
return 1
