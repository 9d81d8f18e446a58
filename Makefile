# gpu-exporter developer entry points. Everything installs into .venv; nothing is global
# except the Debian packages the tests need (prometheus for promtool, kubectl, gcc).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)
ADDRESS ?= 0.0.0.0
PORT ?= 9400

.PHONY: run test lint bench gpu-check demo reliability clean golden .apt-test-deps

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

# Debian packages the suite drives for real: promtool/prometheus, amtool, kubectl, gcc.
.apt-test-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

run: $(VENV)/.installed
	$(VENV)/bin/gpu-exporter serve --backend auto --allow-simulated --address $(ADDRESS) --port $(PORT)

test: $(VENV)/.installed-test .apt-test-deps
	$(VENV)/bin/ruff check exporter tests bench demo
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not reliability_long"

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check exporter tests bench demo
	$(VENV)/bin/mypy

# Regenerate golden exposition files after an intended schema change (review the diff!).
golden: $(VENV)/.installed-test .apt-test-deps
	GOLDEN_UPDATE=1 $(PY) -m pytest tests/unit/serve/test_golden.py -q

bench: $(VENV)/.installed-test .apt-test-deps
	$(PIP) install -e '.[test,k8s,bench]'
	$(PY) -m bench.run --write docs/benchmarks.md
	$(PY) -m bench.profiler 100 1000 --write docs/benchmarks.md

# Optional: exporter (simulated) + Prometheus + profiler --dry-run --once, printing the annotations.
demo: $(VENV)/.installed-test .apt-test-deps
	$(PY) -m demo.run

# The whole reliability suite, long scenarios included (docs/reliability.md).
reliability: $(VENV)/.installed-test .apt-test-deps
	-$(PY) -m pytest tests/reliability -m "reliability_long or not reliability_long" -q
	$(PY) -m tests.reliability.report --check

# Field-by-field comparison against nvidia-smi on a machine with an NVIDIA GPU.
gpu-check: $(VENV)/.installed
	$(PY) -m exporter.tools.gpucheck --markdown docs/validation.md

clean:
	rm -rf $(VENV) tests/fakes/.build .pytest_cache .mypy_cache .ruff_cache
