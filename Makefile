# gpu-defrag: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
SYSTEM_PACKAGES := prometheus prometheus-alertmanager chromium docker-compose slurm-wlm slurmrestd

.PHONY: test demo venv system lint format bench clean nvml-releases

## test: install everything the tests need (Debian packages, venv) and run the suite
test: system venv nvml-releases
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest

## demo: simulated fleet, exporter, advisor and the Streamlit app; prints the URL
demo: venv
	$(VENV)/bin/gpu-defrag demo

venv: $(VENV)/.installed

# Debian's python3 has no ensurepip (so no venv) until python3-venv is installed.
$(VENV)/.installed: pyproject.toml constraints.txt
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || $(MAKE) --no-print-directory system SYSTEM_PACKAGES=python3-venv
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[test]'
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

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

## bench: every benchmark under bench/ (not part of `make test`)
bench: venv
	for b in bench/*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist *.egg-info test-output
