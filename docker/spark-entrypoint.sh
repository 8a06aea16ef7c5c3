#!/usr/bin/env bash
#
# Entrypoint of the Spark image (docker/spark.Dockerfile), run under tini (the image's
# ENTRYPOINT) in the driver pod the chart starts and in the executor pods Spark starts.
#
#   executor   what Spark's executor pods run (args ["executor"], the SPARK_* variables of
#              Spark's BasicExecutorFeatureStep): exec java KubernetesExecutorBackend
#   driver     what a cluster-mode driver pod runs: spark-submit --deploy-mode client
#   anything   exec'd as given; the chart's driver runs `spark-submit ...` this way
#
# Modeled on Apache Spark 4.x's Kubernetes entrypoint (Apache License 2.0):
#   apache/spark-docker 4.0.0/scala2.13-java17-ubuntu/entrypoint.sh (the official image)
#   apache/spark resource-managers/kubernetes/docker/src/main/dockerfiles/spark/entrypoint.sh
# The `driver` and `executor` command lines are theirs, argument for argument. Where this
# script differs, it is for this image:
#   - no second tini: the image's ENTRYPOINT already runs tini as PID 1;
#   - no passwd entry faked (upstream appends to /etc/passwd or uses nss_wrapper): the
#     image has uid 10001 in /etc/passwd and the root filesystem is read-only; another
#     uid gets a warning, because Hadoop's login in the JVM fails without an entry;
#   - SPARK_JAVA_OPT_* are read in memory, in their numeric order as upstream sorts them
#     (upstream writes them to java_opts.txt in the working directory first, which a
#     read-only root filesystem refuses);
#   - an executor works in its first SPARK_LOCAL_DIRS entry (an emptyDir Spark mounts):
#     executors fetch spark.files into their working directory, and /opt/dwell is
#     read-only. That directory is on the classpath as upstream's $PWD (SPARK-43540);
#   - no empty classpath entries (upstream's leading ':' means "the current directory");
#   - `set -euo pipefail` instead of `set -ex`.

set -euo pipefail

if [ -z "${JAVA_HOME:-}" ]; then
  JAVA_HOME=$(java -XshowSettings:properties -version 2>&1 >/dev/null | grep 'java.home' | awk '{print $3}')
fi

if ! getent passwd "$(id -u)" >/dev/null; then
  echo "entrypoint: uid $(id -u) has no passwd entry (the image's user is 10001);" \
       "Hadoop's login in Spark fails without one" >&2
fi

# The executor's classpath, in upstream's order: conf dir, Hadoop conf, Spark's jars,
# spark.executor.extraClassPath (SPARK_EXTRA_CLASSPATH), the working directory.
executor_classpath() {
  local -a cp=()
  if [ -n "${SPARK_CONF_DIR+x}" ]; then
    cp+=("$SPARK_CONF_DIR")
  elif [ -n "${SPARK_HOME+x}" ]; then
    cp+=("$SPARK_HOME/conf")
  fi
  if [ -n "${HADOOP_CONF_DIR+x}" ]; then
    cp+=("$HADOOP_CONF_DIR")
  fi
  if [ -n "${SPARK_CLASSPATH:-}" ]; then
    cp+=("$SPARK_CLASSPATH")
  fi
  cp+=("${SPARK_HOME}/jars/*")
  if [ -n "${SPARK_EXTRA_CLASSPATH:-}" ]; then
    cp+=("$SPARK_EXTRA_CLASSPATH")
  fi
  cp+=("$PWD")
  # If HADOOP_HOME is set and SPARK_DIST_CLASSPATH is not, Hadoop's jars join (upstream).
  if [ -n "${HADOOP_HOME:-}" ] && [ -z "${SPARK_DIST_CLASSPATH:-}" ]; then
    SPARK_DIST_CLASSPATH="$("$HADOOP_HOME/bin/hadoop" classpath)"
  fi
  if [ -n "${SPARK_DIST_CLASSPATH:-}" ]; then
    cp+=("$SPARK_DIST_CLASSPATH")
  fi
  local IFS=:
  echo "${cp[*]}"
}

case "${1:-}" in
  driver)
    shift 1
    exec "$SPARK_HOME/bin/spark-submit" \
      --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
      --deploy-mode client \
      "$@"
    ;;
  executor)
    shift 1
    if [ -n "${SPARK_LOCAL_DIRS:-}" ]; then
      cd "${SPARK_LOCAL_DIRS%%,*}"
    fi
    SPARK_CLASSPATH="$(executor_classpath)"
    # SPARK_JAVA_OPT_<n>: spark.executor.extraJavaOptions and Spark's own -D options, one
    # per variable, in n's order (upstream: sort -t_ -k4 -n).
    SPARK_EXECUTOR_JAVA_OPTS=()
    while IFS= read -r name; do
      if [ -n "$name" ]; then
        SPARK_EXECUTOR_JAVA_OPTS+=("${!name}")
      fi
    done < <(compgen -v SPARK_JAVA_OPT_ | sort -t_ -k4 -n)
    exec "${JAVA_HOME}/bin/java" \
      "${SPARK_EXECUTOR_JAVA_OPTS[@]}" \
      -Xms"$SPARK_EXECUTOR_MEMORY" \
      -Xmx"$SPARK_EXECUTOR_MEMORY" \
      -cp "$SPARK_CLASSPATH" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "$SPARK_DRIVER_URL" \
      --executor-id "$SPARK_EXECUTOR_ID" \
      --cores "$SPARK_EXECUTOR_CORES" \
      --app-id "$SPARK_APPLICATION_ID" \
      --hostname "$SPARK_EXECUTOR_POD_IP" \
      --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" \
      --podName "$SPARK_EXECUTOR_POD_NAME"
    ;;
  "")
    echo "usage: entrypoint.sh executor | driver [spark-submit args] | command [args]" >&2
    exit 64
    ;;
  *)
    # Non-spark-on-k8s command provided, proceeding in pass-through mode (upstream).
    exec "$@"
    ;;
esac
