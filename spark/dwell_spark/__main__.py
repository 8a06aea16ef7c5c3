"""`python -m dwell_spark`: start the Spark session and its streaming queries (the drain,
and the backoff, which also sets malformed dwell.acks events aside) in one application, and run
until one of them stops."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from dwell import memory
from dwell.adapters import redis as redis_adapter
from dwell.adapters.kafka import ensure_dwell_topics
from dwell.auth.guard import Guard
from dwell.security import java_oauth_system_properties, server_context

from . import backoff, drain, metrics
from .settings import SparkSettings

log = logging.getLogger("dwell.spark")


def session(settings: SparkSettings) -> SparkSession:
    # Python workers inherit the JVM's environment: let them import dwell_spark and use
    # the same interpreter (its venv has dwell, pandas, pyarrow).
    here = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = (SparkSession.builder.appName("dwell")
         .master(settings.spark_master)
         .config("spark.ui.enabled", "false")
         .config("spark.python.daemon.module", "dwell_spark.daemon")
         # The drain hands its wanted ranges to the JVM as a pandas frame.
         .config("spark.sql.execution.arrow.pyspark.enabled", "true")
         # Micro-batches only when there is input: the backoff has nothing to do without
         # events, and the drain's source always has a row.
         .config("spark.sql.streaming.noDataMicroBatches.enabled", "false"))
    if "://" not in settings.spark_checkpoint_dir or settings.spark_checkpoint_dir.startswith(
            "file:"):
        # On a local disk Hadoop's FileContext rename forks `readlink` for every
        # checkpoint file (several per micro-batch); FileSystem's rename does not.
        b = b.config("spark.sql.streaming.checkpointFileManagerClass",
                     "org.apache.spark.sql.execution.streaming.checkpointing."
                     "FileSystemBasedCheckpointFileManager")
    if settings.spark_master.startswith("local"):
        # Local mode has nothing to reach from outside: keep the driver's RPC and block
        # manager ports on loopback, like every other local process of dwell.
        b = b.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host",
                                                                     "127.0.0.1")
    if settings.spark_jars:
        b = b.config("spark.jars", settings.spark_jars)
    if java_opts := " ".join(java_oauth_system_properties()):
        # The driver's and executors' Kafka clients fetch OAUTHBEARER tokens. (Where
        # spark-submit starts the driver's JVM first, the chart passes these.)
        b = (b.config("spark.driver.extraJavaOptions", java_opts)
             .config("spark.executor.extraJavaOptions", java_opts))
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main() -> int:
    memory.configure()
    settings = SparkSettings()
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_dwell_topics(settings.kafka_bootstrap, settings.kafka_replication_factor,
                        settings.dwell_topic_partitions())
    spark = session(settings)
    log.info("spark session up: Spark %s, master %s", spark.version, settings.spark_master)
    r = redis_adapter.connect(settings.redis_url)
    metrics.set_stall_timeout(settings.batch_stall_timeout_ms / 1000)
    metrics.serve(settings.http_host, settings.spark_metrics_port, server_context(settings),
                  Guard(settings).check_metrics)
    memory.Releaser().start()
    log.info("metrics on %s://%s:%d/metrics", "https" if settings.tls_enabled else "http",
             settings.http_host, settings.spark_metrics_port)
    # Start the Python workers and JIT before the first due bucket does (the first job
    # of a session takes seconds, later ones a fraction).
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x).count()
    # Redeliveries wait until the backoff has read every ack that could cancel them.
    read_to = backoff.AcksReadTo()
    queries = [drain.start(spark, settings, r, read_to),
               backoff.start(spark, settings, r, read_to)]
    metrics.watch(queries)
    log.info("dwell spark app running: %s", ", ".join(q.name for q in queries))
    spark.streams.awaitAnyTermination()
    for q in queries:
        if q.exception() is not None:
            log.error("query %s failed: %s", q.name, q.exception())
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
