# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYX    := $(wildcard src/mqcore/_ext/*.pyx src/mqcore/_ext/*.pxd src/mqcore/_ext/*.h)

.PHONY: build test demo bench lint typecheck clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

# Rebuild the kernels in place whenever a .pyx/.pxd/.h changed since the last build.
$(VENV)/.ext-stamp: $(STAMP) $(PYX) setup.py
	$(PY) setup.py -q build_ext --inplace
	touch $@

build: $(VENV)/.ext-stamp

test: build
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: build
	$(PY) -m mqcore.demo

bench: build
	@mkdir -p .benchmarks
	for run in 1 2 3; do \
		$(PY) -m pytest -q -p no:cacheprovider bench --benchmark-columns=min,median,mean,ops,rounds \
			--benchmark-sort=name --benchmark-json=.benchmarks/run$$run.json || exit 1; \
	done
	$(PY) bench/ratios.py .benchmarks/run1.json .benchmarks/run2.json .benchmarks/run3.json

lint: build
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: build
	$(VENV)/bin/mypy

clean:
	rm -rf build dist *.egg-info src/*.egg-info $(VENV)
	find src -name '*.so' -delete
	find src/mqcore/_ext -name '*.c' -delete
