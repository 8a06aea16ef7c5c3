"""The backoff query's state: one per shard of a (topic, subscription), with every message
of the shard that has a pending redelivery or dead letter. dwell_spark.backoff writes it;
dwell_spark.recovery reads it back (Spark's State Data Source) when Redis lost the
redelivery indexes."""

from __future__ import annotations

from typing import Final

import orjson
from pyspark.sql.types import StringType, StructField, StructType

# Where the backoff query checkpoints, under spark_checkpoint_dir.
CHECKPOINT: Final = "backoff-shards"
# Where it checkpointed when its state was one per message: a layout this one cannot read,
# so an app that finds that directory deletes it (dwell_spark.backoff.drop_old_checkpoint).
OLD_CHECKPOINT: Final = "backoff"
# In that checkpoint: the shard count it was made with (dwell_spark.backoff.fixed_shards).
SHARDS_FILE: Final = "dwell-state-shards"
# Per message: due at ``dueAt`` in the index bucket ``bucket`` (field and offset follow
# from the messageId), as redelivery ``redeliveryCount``, stored as the redelivery index
# stores it (-(count + 1): a dead letter), so that the state alone can put the entry back
# into a lost index. The shard's messages are one JSON text, [messageIds, dueAts, buckets,
# counts] in parallel arrays: PySpark 4 cannot read back a state schema with array fields.
STATE_SCHEMA: Final = StructType([StructField("pending", StringType())])
# (dueAt, bucket, stored count) of one message.
StateEntry = tuple[int, int, int]


def decode_pending(text: str) -> dict[str, StateEntry]:
    """A shard's state text as messageId -> entry."""
    ids, due, buckets, counts = orjson.loads(text)
    return dict(zip(ids, zip(due, buckets, counts, strict=True), strict=True))


def encode_pending(pending: dict[str, StateEntry]) -> str:
    """The state text of ``pending`` (messageId -> entry)."""
    columns = (list(col) for col in zip(*pending.values(), strict=True))
    return orjson.dumps([list(pending), *columns]).decode()
