# The image of dwell's three HTTP services: policy (:8081), admission (:8082) and
# tracker (:8083). One image, three processes: the chart picks one with
# `command: ["python", "-m", "dwell.<service>"]`, so there is no CMD to keep in step.
# Built by CI from the repository root: docker build -f docker/dwell.Dockerfile .
# Runs as uid/gid 10001 on a read-only root filesystem; only /tmp (the chart's
# emptyDir) is written.

# Both stages start from one Debian bookworm base and install Python with apt: upstream
# that is Docker Hub's debian image; `make images` (scripts/images.py) passes
# --build-arg BASE_IMAGE=<a base it makes with mmdebstrap from Debian's packages>.
ARG BASE_IMAGE=debian:12.11-slim

FROM ${BASE_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
WORKDIR /src
# Only what `pip install` reads: the metadata (README.md is its long description), the
# exact versions (constraints.txt), and the two trees of the `dwell` package: client/
# (the dwell-client distribution) and services/. Tests, docs, charts and Spark stay out.
COPY pyproject.toml README.md constraints.txt ./
COPY client ./client
COPY services ./services
# Not editable and no extras: the services need neither pyspark nor the dev tools.
RUN /opt/venv/bin/pip install --no-cache-dir -c constraints.txt ./client .

# The same base and python3 as the builder, so the venv's interpreter link stays valid.
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.source="https://github.com/dwell-dev/dwell" \
      org.opencontainers.image.title="dwell" \
      org.opencontainers.image.description="dwell's policy, admission and tracker services" \
      org.opencontainers.image.licenses="Apache-2.0"

# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only, so .pyc files could not be
# written anyway. DWELL_HTTP_HOST: in a pod the services listen on the pod IP (probes
# and Services reach them there); devstack keeps its 127.0.0.1 default.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DWELL_HTTP_HOST=0.0.0.0

# A numeric uid/gid the chart's securityContext names (runAsUser/runAsGroup 10001), with
# a passwd entry so getpwuid() works; its home is /tmp, the only writable path.
# --no-log-init: a high uid would otherwise make useradd write a sparse multi-MB lastlog.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 dwell \
 && useradd --uid 10001 --gid 10001 --no-log-init --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin dwell

COPY --from=builder /opt/venv /opt/venv

WORKDIR /app
USER 10001:10001
EXPOSE 8081 8082 8083
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz and ignores Docker's.
