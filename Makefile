# gpu-defrag: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SYSTEM_PACKAGES := prometheus prometheus-alertmanager chromium docker-compose slurm-wlm slurmrestd openssl

.PHONY: test demo venv peers-venv system lint format bench lock clean nvml-releases

## test: install everything the tests need (Debian packages, venv) and run the suite
test: system venv peers-venv nvml-releases
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -n 3 --dist loadscope

## demo: simulated fleet, exporter, advisor and the Streamlit app; prints the URL
demo: venv
	$(VENV)/bin/gpu-defrag demo

venv: $(VENV)/.installed

## peers-venv: statsforecast for bench/forecast_peers.py, in an environment of its own (it needs
## pandas < 3; the product pins pandas 3); the bench smoke test runs it
peers-venv: .venv-peers/.installed

.venv-peers/.installed: bench/requirements-peers.txt
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || $(MAKE) --no-print-directory system SYSTEM_PACKAGES=python3-venv
	$(PYTHON) -m venv .venv-peers
	.venv-peers/bin/pip install -q --upgrade pip
	.venv-peers/bin/pip install -q -r bench/requirements-peers.txt
	touch $@

# Debian's python3 has no ensurepip (so no venv) until python3-venv is installed.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || $(MAKE) --no-print-directory system SYSTEM_PACKAGES=python3-venv
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[all,test]'
	touch $@

## nvml-releases: the nvidia-ml-py releases the NVML backend's tests also run against
## (tests/exporter/test_nvml_releases.py), one pip --target directory each
nvml-releases: venv
	@for v in $$($(PY) -c 'from tests.exporter.test_nvml_releases import releases; print(*releases())'); do \
	  [ -f $(VENV)/nvml-releases/$$v/pynvml.py ] || \
	  $(PIP) install -q --no-deps --target $(VENV)/nvml-releases/$$v nvidia-ml-py==$$v || exit 1; \
	done

## system: Debian packages for the integration tests (Prometheus, Alertmanager, Chromium, docker-compose, Slurm)
system:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  echo "installing:$$missing"; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@# Debian's kubernetes-client (1.20) has a kustomize too old for components: kubectl comes from upstream
	@command -v kubectl >/dev/null || echo "note: kubectl >= 1.21 is not installed; tests/ops render the deploy/ overlays with 'kubectl kustomize' (https://kubernetes.io/docs/tasks/tools/)"

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## bench: every benchmark under bench/ (not part of `make test`)
bench: venv peers-venv
	for b in bench/*.py; do [ $$b = bench/peers_worker.py ] || $(PY) $$b || exit 1; done

## lock: the images' lock files with hashes (requirements/*.txt) from pyproject.toml and constraints.txt
LOCK := $(VENV)/bin/uv pip compile pyproject.toml -c constraints.txt --generate-hashes --universal --python-version 3.11 --quiet
lock: venv
	$(PIP) install -q -c constraints.txt uv
	$(LOCK) -o requirements/exporter.txt
	$(LOCK) --extra all -o requirements/full.txt

clean:
	rm -rf $(VENV) .venv-peers build dist *.egg-info test-output
