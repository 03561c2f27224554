# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYX    := $(wildcard src/mqcore/_ext/*.pyx src/mqcore/_ext/*.pxd src/mqcore/_ext/*.h src/mqcore/*/*.pyx)

WORKFLOWS := $(wildcard .github/workflows/*.yml)

.PHONY: build test test-tools demo bench lint typecheck sdist wheel wheel-test sdist-test clean fuzz fuzz-build asan

JOBS   ?= $(shell nproc 2>/dev/null || echo 2)

# The editable install builds no kernels (MQCORE_KERNELS=none): the rule below builds them once,
# in place, where the editable install's path entry (src/) finds them.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	MQCORE_KERNELS=none $(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

# Rebuild the kernels in place whenever a .pyx/.pxd/.h changed since the last build, on every
# core (Cython's translation and the C compiles both).
$(VENV)/.ext-stamp: $(STAMP) $(PYX) setup.py
	MQCORE_BUILD_JOBS=$(JOBS) $(PY) setup.py -q build_ext --inplace --parallel $(JOBS)
	touch $@

build: $(VENV)/.ext-stamp

test: build test-tools
	$(PY) -m pytest -q -p no:cacheprovider tests

# Programs the tests drive that pip cannot install, from Debian's packages, only when missing and
# only as root (apt-get update first only if the install fails), each on its own: one that
# cannot be had is one line saying whose tests will skip, and `make test` goes on either way.
# kcat (tests/test_server_kcat.py); Chromium with its WebDriver (tests/test_console_browser.py
# drives the console in a headless browser through Selenium); the Kafka clients and tools of
# tests/test_clients_*.py (docs/testing.md "Kafka clients from Debian"): rsyslog's omkafka;
# Go with the sources of sarama, kafka-go, confluent-kafka-go and optiopay/kafka (the tests
# build tests/clients/*.go against them with GOPATH=/usr/share/gocode, offline); Burrow;
# ZooKeeper (Burrow keeps its state there, and tests/test_cluster_*.py run one); Debian's
# kafka-python and confluent-kafka (run by /usr/bin/python3); nginx with lua-nginx-kafka;
# ProFTPD's mod_kafka. syslog-ng's Kafka module is unpacked into $(TEST_TOOLS_DIR) instead
# (tests/clients/unpack-syslog-ng.sh says why).
TEST_TOOLS_DIR := /opt/mqcore-test-tools
DEBIAN_TOOLS := rsyslog-kafka:rsyslog-omkafka golang-go:Go \
	golang-github-shopify-sarama-dev:sarama golang-github-segmentio-kafka-go-dev:kafka-go \
	golang-github-confluentinc-confluent-kafka-go-dev:confluent-kafka-go \
	golang-github-optiopay-kafka-dev:optiopay-kafka burrow:Burrow \
	zookeeper:ZooKeeper python3-kafka:kafka-python python3-confluent-kafka:confluent-kafka \
	nginx-light:lua-nginx-kafka libnginx-mod-http-lua:lua-nginx-kafka \
	lua-nginx-kafka:lua-nginx-kafka proftpd-mod-kafka:proftpd-mod-kafka

test-tools:
	@root() { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }; \
	install() { \
		what=$$1; shift; \
		if ! root; then echo "$$what is missing (apt-get install $$* as root): its tests will skip"; \
		elif ! { apt-get install -y -q --no-install-recommends "$$@" >/dev/null 2>&1 || \
			{ apt-get update -q >/dev/null 2>&1 && \
			  apt-get install -y -q --no-install-recommends "$$@" >/dev/null 2>&1; }; }; then \
			echo "$$what could not be installed: its tests will skip"; fi; }; \
	installed() { dpkg-query -W -f='$${db:Status-Abbrev}' "$$1" 2>/dev/null | grep -q '^ii'; }; \
	export DEBIAN_FRONTEND=noninteractive; \
	command -v kcat >/dev/null 2>&1 || install kcat kcat; \
	{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || \
		install "chromium (the console's browser tests)" chromium chromium-driver; \
	for tool in $(DEBIAN_TOOLS); do \
		installed "$${tool%%:*}" || install "$${tool%%:*} ($${tool#*:})" "$${tool%%:*}"; \
	done; \
	[ -x $(TEST_TOOLS_DIR)/syslog-ng/usr/sbin/syslog-ng ] || installed syslog-ng-mod-rdkafka || \
		if ! root; then echo "syslog-ng-mod-rdkafka is missing (make test-tools as root unpacks it):" \
			"its tests will skip"; \
		elif ! sh tests/clients/unpack-syslog-ng.sh $(TEST_TOOLS_DIR)/syslog-ng >/dev/null 2>&1; then \
			echo "syslog-ng-mod-rdkafka could not be unpacked: its tests will skip"; fi

demo: build
	$(PY) -m mqcore.demo

bench: build
	@mkdir -p .benchmarks
	for run in 1 2 3; do \
		$(PY) -m pytest -q -p no:cacheprovider bench --benchmark-columns=min,median,mean,ops,rounds \
			--benchmark-sort=name --benchmark-json=.benchmarks/run$$run.json || exit 1; \
	done
	$(PY) bench/ratios.py .benchmarks/run1.json .benchmarks/run2.json .benchmarks/run3.json

# Also checks the release set-up: the workflows against GitHub's schema and zizmor's audits
# (actions pinned to commits, no credentials left in checkouts, no template injection), and the
# cibuildwheel configuration (it rejects unknown options and lists the wheels it would build).
lint: build
	$(VENV)/bin/ruff check src tests bench tools
	$(VENV)/bin/ruff check --select SLF001 src
	$(VENV)/bin/ruff format --check src tests bench tools
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows $(WORKFLOWS)
	$(VENV)/bin/zizmor --offline --no-progress .github/workflows
	$(VENV)/bin/cibuildwheel --print-build-identifiers --platform linux --archs x86_64,aarch64
	$(VENV)/bin/cibuildwheel --print-build-identifiers --platform macos --archs x86_64,arm64

typecheck: build
	$(VENV)/bin/mypy

# Release artifacts. The sdist holds sources only (MANIFEST.in); `make wheel` builds the sdist and
# then the wheel from it, so the wheel cannot pick up in-place builds or stale build/ output, and
# puts the wheel in wheelhouse/: repaired by auditwheel on Linux (manylinux tag; debug symbols
# stripped, they are most of the compiled modules' size), copied as is elsewhere.
sdist: $(STAMP)
	rm -rf dist
	$(PY) -m build --sdist --outdir dist .
	$(VENV)/bin/twine check --strict dist/*

wheel: $(STAMP)
	rm -rf dist wheelhouse
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*
	mkdir -p wheelhouse
	if [ -x $(VENV)/bin/auditwheel ]; then \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
			$(VENV)/bin/auditwheel repair --strip --wheel-dir wheelhouse dist/*.whl; \
	else \
		cp dist/*.whl wheelhouse/; \
	fi
	ls -l wheelhouse

# The suite against an install, in a fresh venv, from a copy of the tests outside the source
# tree (tools/test_installed.py checks that `import mqcore` resolves to site-packages).
# wheel-test installs the wheel from `make wheel`; sdist-test builds the sdist in dist/ from
# source (a C compiler is all it needs; setuptools and Cython come from the build isolation)
# and runs the tests the sdist ships.
TEST_VENV := build/installed-test-venv

wheel-test:
	@test -n "$(wildcard wheelhouse/*.whl)" || { echo "no wheel in wheelhouse/: run make wheel"; exit 1; }
	rm -rf $(TEST_VENV)
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(TEST_VENV)/bin/python -m pip install -q "$(firstword $(wildcard wheelhouse/*.whl))[test]"
	$(TEST_VENV)/bin/python tools/test_installed.py

sdist-test:
	@test -n "$(wildcard dist/*.tar.gz)" || { echo "no sdist in dist/: run make sdist"; exit 1; }
	rm -rf $(TEST_VENV) build/sdist-unpacked
	mkdir -p build/sdist-unpacked
	tar -xzf $(firstword $(wildcard dist/*.tar.gz)) -C build/sdist-unpacked
	$(PYTHON) -m venv $(TEST_VENV)
	$(TEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(TEST_VENV)/bin/python -m pip install -q "$(firstword $(wildcard dist/*.tar.gz))[test]"
	$(TEST_VENV)/bin/python build/sdist-unpacked/*/tools/test_installed.py \
		--source $$(echo build/sdist-unpacked/*)

# Fuzzing (harnesses in fuzz/, figures in docs/testing.md). fuzz-build compiles the kernels a second
# time with clang, libFuzzer coverage, AddressSanitizer and UndefinedBehaviorSanitizer (every UB
# check aborts) into build/fuzz (a copy of the package, so the in-place build stays untouched);
# `make fuzz` seeds the corpora from a real store and runs every harness for FUZZ_RUNS executions
# (and at most FUZZ_SECONDS each, 0 = no cap), one after the other, over that build with atheris'
# ASan + UBSan + libFuzzer runtime preloaded. FUZZ_PREFIX goes in front of each run (e.g.
# FUZZ_PREFIX="taskset -c 1 nice -n 19" on a shared machine). ASan options: leak detection off
# (CPython keeps memory until exit); no allocation stacks (malloc_context_size=0: recording one for
# every CPython allocation halved the rate; a report still has the faulting access's stack, and
# replaying the saved input with the default options gives the rest). -malloc_limit_mb makes any
# single allocation over 512 MB a finding: a size read from the input that was not checked.
FUZZ_SECONDS ?= 0
FUZZ_RUNS    ?= 1000000
FUZZ_PREFIX  ?=
FUZZ_BUILD   := build/fuzz
ATHERIS_DIR   = $(shell $(PY) -c 'import atheris; print(atheris.path())')
FUZZ_HARNESSES := $(sort $(wildcard fuzz/fuzz_*.py))
FUZZ_SANITIZE  := -fsanitize=fuzzer-no-link,address,undefined
FUZZ_ASAN_OPTIONS := detect_leaks=0,allocator_may_return_null=1,malloc_context_size=0
FUZZ_FLAGS := -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 -print_final_stats=1

fuzz-build: $(STAMP)
	rm -rf $(FUZZ_BUILD) build/fuzz-temp
	mkdir -p $(FUZZ_BUILD)
	cp -r src/mqcore $(FUZZ_BUILD)/
	find $(FUZZ_BUILD) -name '*.so' -delete
	CC=clang CFLAGS="-g -O1 -fno-omit-frame-pointer $(FUZZ_SANITIZE) -fno-sanitize-recover=undefined" \
		LDFLAGS="$(FUZZ_SANITIZE)" \
		$(PY) setup.py -q build_ext --build-lib $(FUZZ_BUILD) --build-temp build/fuzz-temp --force

fuzz: fuzz-build
	PYTHONPATH=src $(PY) fuzz/make_corpus.py fuzz/corpus
	mkdir -p fuzz/crashes
	for h in $(FUZZ_HARNESSES); do \
		name=$$(basename $$h .py); name=$${name#fuzz_}; mkdir -p fuzz/corpus/$$name; \
		echo "== $$name"; \
		PYTHONPATH=$(FUZZ_BUILD) LD_PRELOAD=$(ATHERIS_DIR)/asan_with_fuzzer.so \
		ASAN_OPTIONS=$(FUZZ_ASAN_OPTIONS) UBSAN_OPTIONS=print_stacktrace=1 \
			$(FUZZ_PREFIX) $(PY) $$h -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) $(FUZZ_FLAGS) \
			-artifact_prefix=fuzz/crashes/$$name- fuzz/corpus/$$name || exit 1; \
	done

# The suite against kernels built with AddressSanitizer + UndefinedBehaviorSanitizer (gcc), in
# a copy of the tree under build/asan so the in-place build stays untouched. libasan must be
# preloaded (the interpreter is not linked with it). Leak detection is off: CPython keeps its
# arenas and interned objects until exit, which LeakSanitizer reports. Whatever needs a Spark
# session skips (MQCORE_TEST_NO_SPARK): Spark's launcher inherits the preload and hangs.
ASAN_TREE := build/asan

asan: $(STAMP)
	rm -rf $(ASAN_TREE)
	mkdir -p $(ASAN_TREE)
	cp -r src tests fuzz bench tools setup.py pyproject.toml README.md CHANGELOG.md LICENSE Makefile \
		$(ASAN_TREE)/
	[ ! -d .github ] || cp -r .github $(ASAN_TREE)/
	[ ! -d docs ] || cp -r docs $(ASAN_TREE)/
	find $(ASAN_TREE) -name '*.so' -delete
	cd $(ASAN_TREE) && MQCORE_SANITIZE=1 CFLAGS="-fno-sanitize-recover=undefined" \
		$(abspath $(PY)) setup.py -q build_ext --inplace
	cd $(ASAN_TREE) && PYTHONPATH=src LD_PRELOAD=$$(gcc -print-file-name=libasan.so) \
		ASAN_OPTIONS=detect_leaks=0,abort_on_error=1,strict_string_checks=1 \
		UBSAN_OPTIONS=halt_on_error=1,print_stacktrace=1 MQCORE_TEST_NO_SPARK=1 \
		$(abspath $(PY)) -m pytest -q -p no:cacheprovider tests

clean:
	rm -rf build dist wheelhouse *.egg-info src/*.egg-info $(VENV)
	find src -name '*.so' -delete
	find src/mqcore -name '*.c' ! -name '*_impl.c' -delete
