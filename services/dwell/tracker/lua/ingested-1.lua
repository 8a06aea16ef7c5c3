--[[
  Record how far the ingest has indexed each delay-log partition (dwell:trk:ingested),
  after a batch's positions: compare-and-set per field, so that an entry Redis lost (a
  FLUSHALL, a restart without its data, a rollback) is not quietly put back by the next
  batch: the ingest compares the entry with what it wrote and re-reads what was lost.

  Input:
    KEYS[1] ingested HASH    index field -> next offset indexed
    ARGV    triples: field, the value this writer last set ("" = none: set it whatever
            is there, e.g. the first batch of a partition, or of a re-read), new value

  Output: the number of fields set.
]]
local set = 0
for i = 1, #ARGV, 3 do
  local expected = ARGV[i + 1]
  if expected == "" or redis.call("HGET", KEYS[1], ARGV[i]) == expected then
    redis.call("HSET", KEYS[1], ARGV[i], ARGV[i + 2])
    set = set + 1
  end
end
return set
