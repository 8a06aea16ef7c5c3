--[[
  The lowest offset per index field that some buckets of one topic's index hold, read
  atomically for those buckets (dwell.tracker.recovery.pending_minimums): each bucket's
  live blobs (HASH) and deltas (STRING), claimed blobs (LIST) and claimed deltas
  (STRING). Only the smallest value of each blob is read, from the portable Roaring64
  format (dwell.index.roaring.encode), so no blob is decoded or sent back. The deltas
  are sent back as they are: a burst can leave one bucket with tens of thousands of
  entries before compaction, and reading them here would hold Redis for seconds.

  Input:
    KEYS[1] index ZSET       only its hash tag: every key read here shares it
    ARGV[1] bucket key prefix          live HASH  = prefix .. bucketStart
    ARGV[2] delta key prefix           live STRING
    ARGV[3] claimed key prefix         LIST field, blob, field, blob...
    ARGV[4] claimed delta key prefix   STRING
    ARGV[5..] bucket starts

  Output:
    {flat array field, lowest offset, ... (a field at most once) of the blobs,
     the non-empty delta strings}
]]
local function u16(s, i)
  local a, b = string.byte(s, i, i + 1)
  return a + b * 256
end

local function u32(s, i)
  return u16(s, i) + u16(s, i + 2) * 65536
end

-- The smallest value of the 32-bit portable Roaring bitmap that starts at byte i of s.
local function min32(s, i)
  local cookie = u32(s, i)
  local size, runFlags, p
  if cookie % 65536 == 12347 then            -- SERIAL_COOKIE: some run containers
    size = math.floor(cookie / 65536) + 1
    runFlags = i + 4
    p = runFlags + math.floor((size + 7) / 8)
  elseif cookie == 12346 then                -- SERIAL_COOKIE_NO_RUNCONTAINER
    size = u32(s, i + 4)
    p = i + 8
  else
    error("minima: not a portable Roaring bitmap")
  end
  if size == 0 then error("minima: an empty 32-bit bitmap in a blob") end
  -- (key, cardinality - 1) per container, then the containers' offsets unless a run
  -- bitmap of fewer than 4 containers leaves them out.
  local key = u16(s, p)
  local card = u16(s, p + 2) + 1
  local data = p + 4 * size
  if runFlags == nil or size >= 4 then data = data + 4 * size end
  local low
  if runFlags ~= nil and string.byte(s, runFlags) % 2 == 1 then
    low = u16(s, data + 2)                   -- run count, then (start, length - 1) pairs
  elseif card <= 4096 then
    low = u16(s, data)                       -- sorted values
  else
    local j = data                           -- a bitset: its first bit set
    while string.byte(s, j) == 0 do j = j + 1 end
    local byte, bit = string.byte(s, j), 0
    while byte % 2 == 0 do
      byte = byte / 2
      bit = bit + 1
    end
    low = (j - data) * 8 + bit
  end
  return key * 65536 + low
end

-- The smallest value of a portable Roaring64 blob, nil when it is empty: the 32-bit
-- bitmaps are in ascending order of their high 32 bits, and none is empty.
local function min64(s)
  if u32(s, 1) + u32(s, 5) == 0 then return nil end
  return u32(s, 9) * 4294967296 + min32(s, 13)
end

local low = {}
local function note(field, offset)
  if offset ~= nil and (low[field] == nil or offset < low[field]) then low[field] = offset end
end

local function noteBlobs(flat)
  for j = 1, #flat, 2 do note(tonumber(flat[j]), min64(flat[j + 1])) end
end

local deltas = {}
local function keepDeltas(d)
  if d then deltas[#deltas + 1] = d end
end

for i = 5, #ARGV do
  local b = ARGV[i]
  noteBlobs(redis.call("HGETALL", ARGV[1] .. b))
  keepDeltas(redis.call("GET", ARGV[2] .. b))
  noteBlobs(redis.call("LRANGE", ARGV[3] .. b, 0, -1))
  keepDeltas(redis.call("GET", ARGV[4] .. b))
end

local out = {}
for field, offset in pairs(low) do
  out[#out + 1] = field
  out[#out + 1] = offset
end
return {out, deltas}
