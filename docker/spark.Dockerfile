# The Spark application's image (spark/): the driver pod the chart runs
# (`spark-submit --master k8s://... --deploy-mode client ... /opt/dwell/spark/launch.py`)
# and the executor pods that driver asks the API server for
# (spark.kubernetes.container.image, started with the single argument `executor`).
# Built by CI from the repository root: docker build -f docker/spark.Dockerfile .
# Runs as uid/gid 10001 on a read-only root filesystem: /tmp is the chart's emptyDir, and
# Spark mounts its local dirs (SPARK_LOCAL_DIRS) as emptyDirs on executors.

# Every stage starts from one Debian bookworm base and installs what it needs with apt:
# upstream that is Docker Hub's debian image; `make images` (scripts/images.py) passes
# --build-arg BASE_IMAGE=<a base it makes with mmdebstrap from Debian's packages>.
ARG BASE_IMAGE=debian:12.11-slim

# Spark's Kafka connector and its dependencies, from Maven Central at build time
# (spark/pom.xml says which and why), so nothing is resolved at run time. Debian's
# maven and JDK 17, as for the runtime's JRE. /usr/share/man/man1: the JDK's postinst
# installs man-page alternatives into it, and the slim image has none.
FROM ${BASE_IMAGE} AS jars
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends maven openjdk-17-jdk-headless \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY spark/pom.xml pom.xml
RUN mvn -q -B -f pom.xml dependency:copy-dependencies -DoutputDirectory=/jars \
      -DincludeScope=runtime

# The same base and python3 as the runtime stage, so the venv's interpreter stays valid.
FROM ${BASE_IMAGE} AS venv
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY client ./client
COPY services ./services
# The spark extra pins pyspark (pyspark==4.2.0, equal to spark/pom.xml's spark.version):
# the pip distribution is a whole Spark runtime (bin/, jars/ with spark-kubernetes), so
# the image needs no separate Spark download. dwell_spark itself is not a distribution:
# it is copied below and found through PYTHONPATH.
RUN /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ./client '.[spark]'

FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.source="https://github.com/dwell-dev/dwell" \
      org.opencontainers.image.title="dwell-spark" \
      org.opencontainers.image.description="dwell's drain and backoff Spark application (driver and executors)" \
      org.opencontainers.image.licenses="Apache-2.0"

# Debian's path for amd64; the RUN below fails the build where it is not (another
# architecture), rather than shipping an image whose Spark cannot find Java.
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64

# python3: the venv's interpreter. openjdk-17: Spark 4 runs on Java 17 or 21. tini: PID 1 that forwards SIGTERM to the
# driver or executor and reaps Python workers. procps: Spark's scripts call `ps`.
# /usr/share/man/man1: the JRE's postinst installs man-page alternatives into it, and the
# slim image has none.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3 openjdk-17-jre-headless tini procps \
 && rm -rf /var/lib/apt/lists/* \
 && test -x "$JAVA_HOME/bin/java" \
 && groupadd --gid 10001 dwell \
 && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin dwell

COPY --from=venv /opt/venv /opt/venv

# SPARK_HOME is pyspark's package directory: its bin/spark-submit and jars/ are the Spark
# runtime. PYSPARK_PYTHON: the executors' Python workers use the venv that has dwell and
# pyarrow. DWELL_HTTP_HOST: /metrics, /healthz and /readyz (8084) on the pod IP.
ENV PATH=/opt/venv/bin:$PATH \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    PYTHONPATH=/opt/dwell/spark \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DWELL_HTTP_HOST=0.0.0.0

# Into pyspark's own jars/: the driver's and the executors' JVMs load $SPARK_HOME/jars/*,
# so the Kafka source and sink are on every classpath without spark.jars.
COPY --from=jars /jars/ ${SPARK_HOME}/jars/
COPY spark /opt/dwell/spark
COPY --chmod=0755 docker/spark-entrypoint.sh /opt/dwell/entrypoint.sh
# The layout the entrypoint relies on: one Spark (pyspark's) with Kubernetes support and
# the Kafka connector next to it.
RUN test -x "$SPARK_HOME/bin/spark-submit" \
 && ls "$SPARK_HOME"/jars/spark-kubernetes_2.13-*.jar "$SPARK_HOME"/jars/spark-sql-kafka-0-10_2.13-*.jar

WORKDIR /opt/dwell
USER 10001:10001
# 8084: the app's metrics and health; 7078: spark.driver.port; 7079: spark.blockManager.port
# (fixed, so the driver's Service and NetworkPolicies can name them).
EXPOSE 8084 7078 7079
# No HEALTHCHECK: Kubernetes probes the driver's /healthz and /readyz.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/dwell/entrypoint.sh"]
