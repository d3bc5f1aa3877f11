# The two commands: `make demo` and `make test`. Both bootstrap what they need and are idempotent.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# CPU build of PyTorch; a bare `torch` would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0

.PHONY: demo lab test venv system-deps kube lint unit clean image bench

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(wildcard /opt/wheels),--find-links /opt/wheels) $(TORCH_PIN)
	$(PY) -m pip install -q -e '.[dev,training,integrations]' $(TORCH_PIN)
	touch $@

venv: $(VENV)/.installed

# Debian packages for the real servers the tests start (Slurm, Prometheus, etcd, Chromium, Go).
system-deps:
	scripts/bootstrap-system.sh

# A real kube-apiserver (1.20.2) built from Debian's source package, cached under ~/.cache.
kube: system-deps
	scripts/build-kube.sh

# The image the manifests name (ghcr.io/gpuvigil/gpuvigil:<version>), built with buildah
# from a Debian base made by mmdebstrap; docs/security.md says how to push it.
image: venv system-deps
	scripts/build-image.sh

demo: venv
	$(VENV)/bin/gpuvigil demo

# Faults through the whole platform on real parts (docs/lab.md): make lab FAULT=xid79,
# or several in one lab: make lab FAULT="xid48 xid79"
FAULT ?= xid48
lab: venv kube image
	$(VENV)/bin/gpuvigil lab $(foreach f,$(FAULT),--fault $(f))

lint: venv
	$(VENV)/bin/ruff check $(wildcard src tests bench examples)
	$(VENV)/bin/ruff format --check $(wildcard src tests bench examples)
	$(VENV)/bin/lint-imports

test: venv system-deps kube lint
	$(PY) -m pytest -q -p no:cacheprovider

# The benchmarks that compare with other tools (docs/performance.md); ripgrep is installed
# for bench/logscan.py only, never for the tests.
bench: venv
	scripts/bootstrap-bench.sh
	PYTHONPATH=src $(PY) bench/logscan.py

unit: venv
	$(PY) -m pytest -q tests/unit

clean:
	rm -rf $(VENV) build *.egg-info
