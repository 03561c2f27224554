#!/bin/sh
# Run librdkafka's own integration tests against `mqcore serve`, each test alone against a
# fresh store, so that one test's leftovers cannot fail the next (docs/server.md "librdkafka's
# test suite"). Not part of `make test`: it needs a built librdkafka checkout and runs for over
# an hour.
#
#   tools/librdkafka_suite.sh LIBRDKAFKA_DIR OUT_DIR [TEST_NUMBER ...]
#
# LIBRDKAFKA_DIR is a checkout built with `./configure && make && make -C tests build`.
# Without test numbers, every numbered test the checkout has runs (0000-0999). Per test, OUT_DIR
# gets NNNN.log (the runner's output), NNNN.json (its report), NNNN.server.log (the server at
# debug level) and a line "NNNN rc=CODE" in rc.txt; a test whose NNNN.json exists is skipped,
# so a stopped run goes on where it left off. At the end the report states are counted.
# Environment: PYTHON (default: the project's .venv/bin/python), PORT (default 29192),
# TIMEOUT per test in seconds (default 1500).
set -u
[ $# -ge 2 ] || { echo "usage: $0 LIBRDKAFKA_DIR OUT_DIR [TEST_NUMBER ...]" >&2; exit 2; }
rdk=$(cd "$1" && pwd) || exit 2
mkdir -p "$2" && out=$(cd "$2" && pwd) || exit 2
shift 2
here=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$here/.venv/bin/python}
port=${PORT:-29192}
timeout=${TIMEOUT:-1500}
[ -x "$rdk/tests/test-runner" ] || { echo "$rdk/tests/test-runner is not built" >&2; exit 2; }
if [ $# -eq 0 ]; then
    set -- $(ls "$rdk"/tests/0[0-9][0-9][0-9]-*.c "$rdk"/tests/0[0-9][0-9][0-9]-*.cpp 2>/dev/null |
             sed 's|.*/\([0-9]\{4\}\)-.*|\1|' | sort -u)
fi
store=$(mktemp -d)
printf 'bootstrap.servers=127.0.0.1:%s\ntest.timeout.multiplier=2\n' "$port" > "$store/test.conf"
for n in "$@"; do
    [ -e "$out/$n.json" ] && continue
    rm -rf "$store/s"
    "$python" -m mqcore.cli serve "$store/s" --create --listen "127.0.0.1:$port" \
        --partitions 4 --log-level debug > "$out/$n.server.log" 2>&1 &
    server=$!
    i=0
    until grep -q serving "$out/$n.server.log" || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
    (cd "$rdk/tests" && RDKAFKA_TEST_CONF="$store/test.conf" TESTS=$n TEST_KAFKA_VERSION=3.9.0 \
        TEST_REPORT="$out/$n.json" \
        LD_LIBRARY_PATH=../src:../src-cpp timeout "$timeout" ./test-runner -p1) \
        > "$out/$n.log" 2>&1
    echo "$n rc=$?" >> "$out/rc.txt"
    kill "$server"; wait "$server" 2>/dev/null
done
rm -rf "$store"
# each report lists every test; count the ones of its own number
"$python" - "$out" <<'EOF'
import collections, glob, json, os, sys

states, failed = collections.Counter(), []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "[0-9]" * 4 + ".json"))):
    number = os.path.basename(path)[:4]
    try:
        with open(path) as f:
            tests = json.load(f).get("tests", {})
    except ValueError:
        states["report unreadable"] += 1
        continue
    for name, test in tests.items():
        if name[:4] == number:
            states[test.get("state")] += 1
            if test.get("state") not in ("PASSED", "SKIPPED"):
                failed.append(name)
print(", ".join(f"{n} {s.lower()}" for s, n in states.most_common()))
print("not passed:", " ".join(failed) or "none")
EOF
