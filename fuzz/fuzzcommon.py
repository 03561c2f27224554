"""Shared set-up of the fuzz harnesses: instrumented import of mqcore and the run loop.

Every harness imports this module first. It imports the whole `mqcore` package under atheris'
bytecode instrumentation (Python-level coverage); the Cython kernels get native coverage when the
package comes from the clang build of `make fuzz-build`. A harness's test function lets only the
exceptions in EXPECTED escape its own checks: anything else, a crash, a hang (-timeout) or a
sanitizer report is a finding.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

import atheris

with atheris.instrument_imports(include=["mqcore"]):
    import mqcore
    import mqcore.compression
    import mqcore.query.ids
    import mqcore.query.selector
    import mqcore.storage.index
    import mqcore.storage.keyindex
    import mqcore.storage.logdir
    from mqcore._ext import batch, crc32c, index, keyindex, scan  # noqa: F401
    from mqcore.errors import MQCoreError

# What bad bytes may raise: the library's own errors (several also subclass ValueError etc.).
EXPECTED: tuple[type[BaseException], ...] = (MQCoreError,)

# A bound on decompressed sizes, so a tiny input claiming gigabytes stops early (a finding would be
# a decompressor that ignores it, which shows as -rss_limit_mb).
MAX_DECOMPRESSED = 1 << 20

# Where harnesses that need files put them: MQCORE_FUZZ_SCRATCH when set, else tmpfs when there
# is one. libFuzzer ends the process with exit(), which skips Python's atexit, so a run's
# directories stay behind: the smoke test (tests/test_fuzz_smoke.py) points them into its own
# temporary directory.
SCRATCH = os.environ.get("MQCORE_FUZZ_SCRATCH") or (
    "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
)


def scratch_dir(prefix: str) -> str:
    """A fresh directory under SCRATCH for one harness run, removed when Python exits normally
    (not when libFuzzer ends the run: see SCRATCH)."""
    path = tempfile.mkdtemp(prefix=prefix, dir=SCRATCH)
    atexit.register(shutil.rmtree, path, True)
    return path


def run(test_one_input: Callable[[bytes], None]) -> None:
    """Hand the harness to libFuzzer with the command line's options (corpus dirs, -runs=...)."""
    print(f"mqcore from {os.path.dirname(mqcore.__file__)}", file=sys.stderr)
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


def touch_message(m: batch.Message) -> None:
    """Materialise every field of a decoded message, as a consumer would."""
    _ = (m.offset, m.timestamp, m.timestamp_type, m.key, m.value, m.headers, m.msg_id)
    try:
        _ = (m.unique_id, m.tag, m.properties)
    except EXPECTED:
        pass
