"""dwell's Spark application: the drain (due buckets → ready and retry topics) and the
backoff job (dwell.acks → redelivery indexes and dead letters). Run `python -m dwell_spark`
from `spark/`. Every rule comes from dwell.core and dwell.index."""
