"""The application tests/kube submits in place of /opt/dwell/spark/launch.py: a Spark session
on the master spark-submit gives it (k8s://...), which asks the API server for its
executors; it stops once the file named by its argument exists. dwell's own app needs
Kafka and Redis inside the cluster, which kwok (no containers) cannot give it."""

import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

stop = Path(sys.argv[1])
spark = SparkSession.builder.getOrCreate()
print(f"spark_app: session up, application {spark.sparkContext.applicationId}", flush=True)
deadline = time.monotonic() + 600
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.2)
spark.stop()
print("spark_app: stopped", flush=True)
