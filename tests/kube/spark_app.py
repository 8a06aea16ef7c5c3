"""The application tests/kube submits in place of /opt/dwell/spark/launch.py: a Spark session
on the master spark-submit gives it (k8s://...), which asks the API server for its
executors; it stops when its standard input closes. dwell's own app needs Kafka and Redis
inside the cluster, which kwok (no containers) cannot give it."""

import sys

from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
print(f"spark_app: session up, application {spark.sparkContext.applicationId}", flush=True)
sys.stdin.read()
spark.stop()
print("spark_app: stopped", flush=True)
