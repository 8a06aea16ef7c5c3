"""PySpark's worker daemon (``spark.python.daemon.module``) with dwell's task code
imported once, before it forks: every Python worker starts with dwell_spark, pandas,
pyarrow and redis loaded. PySpark's own daemon imports them in each new worker on its
first task, ~1 s on an idle core and several under load, which made the first backoff
micro-batches of a fresh app seconds late."""

from pyspark import daemon, worker  # noqa: F401

from . import backoff, drain, records  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
