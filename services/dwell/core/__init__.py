"""dwell's pure domain: topic names, durations, policies and their resolution, the publish
rule, bucket math, redelivery backoff and positions. Nothing here does I/O or reads a clock."""
