"""The index layer, used by the tracker and the Spark job alike: the Roaring index in
Redis (PIP-448) of a topic's delayed positions, and of one subscription's redeliveries,
as `bucketStart -> field -> BitMap64(offsets)`.

The tracker writes it and the drain/backoff job claims from it (sync redis client;
`from dwell.index import topic`):

    idx = topic.TopicIndex(redis, "persistent://t/ns/x")
    for b in idx.claim(now_ms, max_buckets=100, lease_ms=30_000, strict=False):
        for partition, offsets in b.positions.items():   # complete data, deltas merged
            ...write the messages at (dwell.delayed, partition, offset) durably...
        idx.complete(b.bucket_start, b.lease_id)          # then delete the bucket

    for name in topic.due_topics(redis, now_ms, strict=False): ...

How it is stored (keys in dwell.keys): each bucket is a HASH field -> serialized
portable `BitMap64` (run-optimized). Adds do not rewrite blobs: they APPEND packed
12-byte entries (u32 field, u64 offset) to a per-bucket delta string and mark the
bucket dirty; `compact()` later folds deltas into the blobs with a compare-and-set
script (`merge-4.lua`). `claim` moves a bucket's blobs AND pending deltas to claimed
keys in one script and `TopicIndex.claim` merges them client-side, so a claim always
returns every position indexed before it, compacted or not. Everything is a set
union, so replays after a crash and duplicate adds change nothing.

Modules: `roaring` (blob and delta codecs), `bucket_index` (what every index shares: claim,
complete, compaction), `topic` (a topic's shared index, the ingest's appends),
`redelivery` (one subscription's redelivery index), `subscriptions` (the registry of
subscriptions' redelivery settings), `marks` (what was delivered, on `dwell.delivered`);
`lua/` holds the scripts.
"""
