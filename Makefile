# dwell's interface: `make run` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
PY := .venv/bin/python
DEVSTACK := python3 scripts/devstack.py
PYTEST_ARGS ?=

.PHONY: help install acls chart-tools kube-up kube-down kube-test run up down status test test-unit test-integration faults fuzz soak lint docs-settings docs chart bench bench-peers client-matrix dist clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-17s %s\n", $$1, $$2}'

install: ## install what is missing: .venv, redis-server, Apache Kafka and Spark jars
	$(DEVSTACK) install

run: ## start the whole stack in the foreground, run the demo; Ctrl-C stops it
	$(DEVSTACK) run --demo

up: ## start the stack in the background (ports 6379, 9092, 8081-8084)
	$(DEVSTACK) up

down: ## stop exactly what `make up` started
	$(DEVSTACK) down

status: ## what runs where
	$(DEVSTACK) status

acls: ## the ACLs the secured stack's Kafka holds, as a table (a stack started with up --secure)
	$(DEVSTACK) acls

chart-tools: ## build helm (go install) and install Prometheus and promtool, for the chart's and dashboards' tests
	$(DEVSTACK) install-chart-tools

kube-up: chart-tools ## a local Kubernetes whose node runs pods: API server, containerd, kubelet, kube-proxy, CoreDNS (root; built once from Go)
	$(DEVSTACK) kube-up

kube-down: ## stop exactly what `make kube-up` started, and put the host back as it was
	$(DEVSTACK) kube-down

.PHONY: dev-tools images images-test
dev-tools: ## build skaffold and tilt (go, from their modules) into .dwell/cache/dev-tools
	python3 scripts/devtools.py build skaffold tilt

images: install ## build the two images with podman on a mmdebstrap base, save them to .dwell/images, run them
	python3 scripts/images.py build
	$(PY) scripts/images.py check

images-test: install ## make images as a test (tests/images; not part of make test: it builds for minutes)
	$(PY) -m pytest tests/images $(PYTEST_ARGS)

test: install chart-tools ## every test suite but tests/images and tests/kubelet, against real Redis and Kafka it starts (and stops) itself
	$(DEVSTACK) --profile test down
	$(DEVSTACK) --profile faults down
	$(DEVSTACK) --profile secure down
	rm -rf .dwell/test .dwell/faults .dwell/secure
	set -o pipefail; rc=0; \
	  $(PY) -m pytest --ignore=tests/images --ignore=tests/kubelet --durations=30 $(PYTEST_ARGS) || rc=$$?; \
	  $(DEVSTACK) --profile test down; $(DEVSTACK) --profile faults down; \
	  $(DEVSTACK) --profile secure down; exit $$rc

kube-test: install chart-tools ## the chart on the real node (tests/kubelet): make images, kube-up, install, helm test, faults
	python3 scripts/images.py build
	$(DEVSTACK) --profile kube kube-down
	$(DEVSTACK) --profile kube down
	$(PY) -m pytest tests/kubelet --durations=10 $(PYTEST_ARGS)

test-unit: install ## the unit tests only (no servers)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

client-matrix: install ## dwell-client on Python 3.9-3.13 (dwell_dev.client_matrix): a fresh venv each, its unit tests, an end to end on the test stack, its install's size
	$(PY) -m pytest tests/e2e/test_client_matrix.py -s $(PYTEST_ARGS)

dist: install ## the wheels and sdists of dwell-client (client/) and dwell (the root) in dist/
	rm -rf dist
	$(PY) -m build --outdir dist client
	$(PY) -m build --outdir dist .

faults: install ## the fault suite at full size (200 msg/s, delays 0-60 s, 2M same-tick burst)
	DWELL_FAULTS_FULL=1 $(PY) -m pytest tests/faults $(PYTEST_ARGS)

fuzz: install ## schemathesis on the OpenAPI specs and the hostile-input fuzz, >= 2,000 cases each, summaries printed
	DWELL_FUZZ_FULL=1 $(PY) -m pytest tests/integration/test_fuzz_openapi.py tests/hostile/test_fuzz.py -s $(PYTEST_ARGS)

soak: install ## 10 min at 2,000 msg/s, a process killed every minute, a Redis FLUSHALL half-way
	$(PY) bench/soak.py

lint: install chart-tools ## ruff on everything, mypy --strict on dwell.core and the SDK, helm lint on the chart
	$(PY) -m ruff check services client spark tests bench scripts
	$(PY) -m mypy --strict services/dwell/core client/src/dwell/core
	$(PY) -m mypy --strict --python-version 3.10 client/src/dwell/client
	.dwell/cache/bin/helm lint charts/dwell --strict

docs-settings: install ## rewrite README.md's configuration tables from the settings classes
	$(PY) -m dwell_dev.settings_table

docs: install ## the SDK's documentation site (mkdocs.yml, docs/client) into site/; any warning fails it
	$(PY) -m mkdocs build --strict

chart: install chart-tools ## the chart's checks: values schema, helm lint/template, Kubernetes schemas, rules
	$(PY) -m dwell_dev.chart_schema --check
	$(PY) -m pytest tests/chart $(PYTEST_ARGS)

# The soak runs on its own (make soak).
BENCHES := admission admission_ceiling tracker delivery backoff ack_timeout rebuild refile sdk_producer sdk_consumer cancel

bench: install ## the benchmarks under bench/ (they start their own servers)
	for b in $(BENCHES); do $(PY) bench/$$b.py || exit 1; done

bench-peers: install ## a 1,000,000-message burst (delays 60-120 s) through dwell, then through kms, a Go Kafka scheduler (MESSAGES=2000000 for 2M)
	python3 scripts/devtools.py build kms
	$(DEVSTACK) --profile test up redis kafka
	$(PY) bench/delivery.py --only 5,6 --burst-messages $(or $(MESSAGES),1000000)

clean: down ## stop the stack and delete .dwell/ state (keeps downloaded jars)
	rm -rf .dwell/dev .dwell/test
