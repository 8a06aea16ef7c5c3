--[[
  Cancel pending delayed messages of a topic: a message's origin position (the one its
  messageId names) goes into the topic's cancellations, which the drain leaves out of
  every round that claims the message's bucket. Atomic against the drain's claim
  (claim-6.lua), whose lease it checks: a message answered "cancelled" is never copied.
  The same rules decide a cancel request and a replacement by schedule key.

  Input:
    KEYS[1] index ZSET          bucketStart -> bucketStart (live buckets)
    KEYS[2] leases HASH         bucketStart -> lease id (claimed buckets)
    KEYS[3] cancellations ZSET  "<partition>:<offset>" -> bucketStart
    KEYS[4] schedule keys HASH  scheduleKey -> "<bucketStart> <partition>:<offset>": the
                                newest indexed message of each key
    KEYS[5] stats HASH          replacedMessages: replacements that cancelled a message
    ARGV[1] mode, then its arguments:
      "answer" bucketStart member cutoff
          a request (the tracker's API): cancel `member` ("<partition>:<offset>" of
          dwell.delayed), due in bucket `bucketStart`, unless a bucket up to `cutoff` (the
          largest that may be drained now, with a margin for the drainers' clocks) may
          be drained already
      "replace" cutoff (scheduleKey bucketStart member)...
          records of the delay log with a schedule key, in log order (the tracker's
          ingest): each replaces the key's message, which is cancelled by the rules of
          "answer"; an empty bucketStart is a release (a message published with the key
          and no delay: nothing of its own is indexed). A record older than the key's
          message (a replay) is the one cancelled instead.
      "victims" cutoff (scheduleKey bucketStart member)...
          what "replace" with the same arguments would cancel, changing nothing: the
          ingest records those cancels in Kafka before it applies the records
      "sweep" latestBucket limit
          drop up to `limit` cancellations of buckets up to `latestBucket` that hold
          nothing, live or claimed (a rebuild puts back every cancellation it finds,
          delivered or not)
      "sweep-keys" latestBucket cursor count
          drop the schedule keys whose message's bucket starts up to `latestBucket` and
          holds nothing, live or claimed: the message was delivered (HSCAN from `cursor`)

  Output:
    answer:     1 CANCELLED (or already: a retried request), 0 DELIVERED (the bucket is
                due and holds nothing any more), -1 TOO_LATE (due, and held or claimed:
                being delivered), -2 BUSY (claimed while not due: the tracker re-files it)
    replace, victims:
                per record, {code, bucketStart, member} of the message it cancelled:
                code 1 (cancelled), 2 (cancelled already), 0, -1 as for "answer", or 3 with
                nothing to cancel. It stops at a record answered -2 (BUSY), whose row is
                the last and changed nothing: the caller asks again from that record.
    sweep:      cancellations dropped
    sweep-keys: {next cursor, keys dropped}
]]
local mode = ARGV[1]

local function idle(bucket)
  return not redis.call("ZSCORE", KEYS[1], bucket) and
      redis.call("HEXISTS", KEYS[2], bucket) == 0
end

-- The rules of a cancel; 2 for a message cancelled already. A dry run decides without
-- cancelling.
local function decide(bucket, member, cutoff, dry)
  if redis.call("ZSCORE", KEYS[3], member) then return 2 end
  local due = tonumber(bucket) <= cutoff
  if redis.call("HEXISTS", KEYS[2], bucket) == 1 then
    if due then return -1 end
    return -2
  end
  if due then
    if redis.call("ZSCORE", KEYS[1], bucket) then return -1 end
    return 0
  end
  -- Not due and not claimed: whatever of the bucket is pending (live, or a re-filed copy
  -- on its way to the index) has not been delivered.
  if not dry then redis.call("ZADD", KEYS[3], bucket, member) end
  return 1
end

-- Whether position `a` ("<partition>:<offset>") comes after `b` in the same partition.
-- Offsets are compared as decimal strings, exact past 2^53.
local function after(a, b)
  local pa, oa = string.match(a, "^(%d+):(%d+)$")
  local pb, ob = string.match(b, "^(%d+):(%d+)$")
  if pa == nil or pb == nil or pa ~= pb then return false end
  if #oa ~= #ob then return #oa > #ob end
  return oa > ob
end

if mode == "answer" then
  local code = decide(ARGV[2], ARGV[3], tonumber(ARGV[4]))
  if code == 2 then return 1 end
  return code
end

if mode == "replace" or mode == "victims" then
  local dry = mode == "victims"
  local cutoff = tonumber(ARGV[2])
  local out = {}
  -- A dry run's moves of the keys: scheduleKey -> value, or false once released.
  local moved = {}
  for i = 3, #ARGV, 3 do
    local key, bucket, member = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local cur = moved[key]
    if cur == nil then cur = redis.call("HGET", KEYS[4], key) end
    local vb, vm, move = "", "", true
    if cur then
      local cb, cm = string.match(cur, "^(%S+) (%S+)$")
      if cm == member or after(cm, member) then
        move = false
        if cm ~= member and bucket ~= "" then vb, vm = bucket, member end
      else
        vb, vm = cb, cm
      end
    end
    local code = 3
    if vm ~= "" then
      code = decide(vb, vm, cutoff, dry)
      if code == -2 then
        out[#out + 1] = {code, vb, vm}
        return out
      end
      if code == 1 and not dry then
        redis.call("HINCRBY", KEYS[5], "replacedMessages", 1)
      end
    end
    if move and dry then
      if bucket == "" then moved[key] = false else moved[key] = bucket .. " " .. member end
    elseif move then
      if bucket == "" then
        redis.call("HDEL", KEYS[4], key)
      else
        redis.call("HSET", KEYS[4], key, bucket .. " " .. member)
      end
    end
    out[#out + 1] = {code, vb, vm}
  end
  return out
end

if mode == "sweep" then
  local rows = redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", ARGV[2], "WITHSCORES", "LIMIT",
                          0, tonumber(ARGV[3]))
  local dropped = 0
  for i = 1, #rows, 2 do
    if idle(rows[i + 1]) then
      redis.call("ZREM", KEYS[3], rows[i])
      dropped = dropped + 1
    end
  end
  return dropped
end

if mode == "sweep-keys" then
  local latest = tonumber(ARGV[2])
  local page = redis.call("HSCAN", KEYS[4], ARGV[3], "COUNT", tonumber(ARGV[4]))
  local rows = page[2]
  local dropped = 0
  for i = 1, #rows, 2 do
    local bucket = string.match(rows[i + 1], "^(%S+) ")
    if bucket and tonumber(bucket) <= latest and idle(bucket) then
      redis.call("HDEL", KEYS[4], rows[i])
      dropped = dropped + 1
    end
  end
  return {page[1], dropped}
end

return redis.error_reply("cancel-5.lua: unknown mode " .. tostring(mode))
