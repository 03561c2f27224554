"""CRC-32C kernel: golden vectors, chaining, hardware against software against a bitwise
reference, and buffer handling."""

import mmap
import os
import random
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqcore._ext.crc32c import crc32c, crc32c_software, hardware_accelerated, implementation

KERNELS = [crc32c, crc32c_software]

# Block sizes of the 3-way hardware path (crc32c_impl.h): lengths around their multiples cross
# every switch between 3-way rounds, single-chain words and single bytes.
LONG = 8192
SHORT = 256
# The folding kernel (x86_64 with VPCLMULQDQ) works in blocks of 16320 bytes: a 7680-byte
# folded region, then three 2880-byte chains.
FOLD_BLOCK = 16320
FOLD_REGION = 7680
FOLD_CHAIN = 2880


def reference_crc32c(data: bytes, crc: int = 0) -> int:
    """Bit-at-a-time CRC-32C: slow, but too simple to share a bug with the kernels."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def random_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


GOLDEN = [
    (b"Some String", 608512271),
    (b"123456789", 0xE3069283),
    (b"", 0),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("data", "expected"), GOLDEN)
def test_golden_vectors(kernel, data, expected):
    assert kernel(data) == expected


@pytest.mark.parametrize(("data", "expected"), GOLDEN)
def test_reference_matches_golden_vectors(data, expected):
    assert reference_crc32c(data) == expected


def test_implementation_names():
    assert implementation() in {"sse4.2+vpclmulqdq", "sse4.2", "armv8-crc", "software"}
    assert hardware_accelerated() == (implementation() != "software")


@pytest.mark.parametrize("kernel", KERNELS)
def test_chaining_equals_one_shot_at_every_split(kernel):
    data = random_bytes(3 * SHORT + 300, seed=1)
    whole = kernel(data)
    for split in range(len(data) + 1):
        assert kernel(data[split:], kernel(data[:split])) == whole, split


@pytest.mark.parametrize("kernel", KERNELS)
def test_crc_argument_is_keyword_and_range_checked(kernel):
    assert kernel(b"6789", crc=kernel(b"12345")) == 0xE3069283
    assert kernel(b"", crc=0xDEADBEEF) == 0xDEADBEEF
    with pytest.raises(OverflowError):
        kernel(b"x", -1)
    with pytest.raises(OverflowError):
        kernel(b"x", 1 << 32)


@pytest.mark.parametrize(
    "n",
    sorted(
        {
            m * block + d
            for block in (SHORT, LONG, FOLD_BLOCK)
            for m in (1, 2, 3, 4, 6, 7)
            for d in (-9, -8, -7, -1, 0, 1, 7, 8, 9, 13)
        }
    ),
)
def test_block_boundaries(n):
    data = random_bytes(n + 8, seed=n)
    for offset in range(8):
        view = memoryview(data)[offset : offset + n]
        assert crc32c(view, 0x12345678) == crc32c_software(view, 0x12345678), offset


def test_block_boundaries_against_reference():
    for n in (3 * SHORT - 1, 3 * SHORT, 3 * SHORT + 13, 6 * SHORT + 7, 3 * LONG + 5,
              FOLD_BLOCK, FOLD_BLOCK + 1):  # fmt: skip
        data = random_bytes(n + 3, seed=n)[3:]
        assert crc32c(data) == reference_crc32c(data), n


def test_a_changed_byte_anywhere_in_a_fold_block_changes_the_crc():
    """One flipped bit in the folded region, in each chain and at every seam changes the CRC
    exactly as in the software kernel (a lane or chain left out of the join would not)."""
    data = bytearray(random_bytes(2 * FOLD_BLOCK + 100, seed=9))
    base = crc32c(data)
    seams = [0, 15, 16, 127, 128, FOLD_REGION - 1, FOLD_REGION]
    seams += [FOLD_REGION + k * FOLD_CHAIN + d for k in (1, 2) for d in (-1, 0)]
    seams += [FOLD_BLOCK - 1, FOLD_BLOCK, FOLD_BLOCK + FOLD_REGION + 5, 2 * FOLD_BLOCK + 99]
    for at in seams:
        data[at] ^= 0x10
        assert crc32c(data) == crc32c_software(data) != base, at
        data[at] ^= 0x10


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 5000),
    offset=st.integers(0, 15),
    seed=st.integers(0, 2**32 - 1),
    crc=st.integers(0, 0xFFFFFFFF),
)
def test_kernels_match_reference(n, offset, seed, crc):
    data = random_bytes(n + offset, seed)
    view = memoryview(data)[offset:]
    expected = reference_crc32c(bytes(view), crc)
    assert crc32c(view, crc) == expected
    assert crc32c_software(view, crc) == expected


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 5000),
    offset=st.integers(0, 15),
    split=st.integers(0, 5000),
    seed=st.integers(0, 2**32 - 1),
)
def test_hardware_matches_software_chained(n, offset, split, seed):
    view = memoryview(bytearray(random_bytes(n + offset, seed)))[offset:]
    split = min(split, n)
    whole = crc32c_software(view)
    assert crc32c(view) == whole
    assert crc32c(view[split:], crc32c(view[:split])) == whole


FORCED_CHECK = """
import random, sys
from mqcore._ext.crc32c import crc32c, crc32c_software, implementation
rng = random.Random(3)
for n in (0, 1, 767, 768, 24576, 16319, 16320, 16321, 3 * 16320 + 8193, 1 << 20):
    data = rng.randbytes(n + 5)[5:]
    assert crc32c(data, 7) == crc32c_software(data, 7), n
print(implementation())
"""


@pytest.mark.parametrize("forced", ["software", "sse4.2", "armv8-crc"])
def test_every_kernel_the_machine_has_agrees(forced):
    """MQCORE_CRC32C picks a slower kernel: the plain CRC32 one stays tested on CPUs that would
    fold, and a name the machine cannot run falls back to the best kernel."""
    env = dict(os.environ, MQCORE_CRC32C=forced)
    out = subprocess.run(
        [sys.executable, "-c", FORCED_CHECK], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    if forced == "software" or forced == implementation().split("+")[0]:
        assert out == forced
    else:
        assert out == implementation()


def test_large_buffer_matches_software():
    data = random_bytes(5 * 1024 * 1024 + 77, seed=5)
    assert crc32c(data) == crc32c_software(data)
    view = memoryview(data)[3:]
    assert crc32c(view) == crc32c_software(view)
    half = len(view) // 2 + 1
    assert crc32c(view[half:], crc32c(view[:half])) == crc32c(view)


def test_threads_share_the_kernel():
    data = random_bytes(1024 * 1024, seed=6)
    expected = crc32c_software(data)
    results = []

    def work():
        results.extend(crc32c(data) for _ in range(20))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [expected] * 80


@pytest.mark.parametrize("kernel", KERNELS)
def test_buffer_types(kernel):
    data = random_bytes(100_000, seed=7)
    expected = reference_crc32c(data[:1000])
    full = crc32c_software(data)
    assert kernel(bytearray(data[:1000])) == expected
    assert kernel(memoryview(data)[:1000]) == expected
    assert kernel(memoryview(bytearray(data)).toreadonly()[:1000]) == expected
    with mmap.mmap(-1, len(data)) as m:
        m.write(data)
        assert kernel(m) == full
    view = memoryview(data)
    assert kernel(view) == full
    view.release()


@pytest.mark.parametrize("kernel", KERNELS)
def test_read_only_file_mmap(kernel, tmp_path):
    data = random_bytes(70_000, seed=8)
    path = tmp_path / "segment"
    path.write_bytes(data)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert kernel(m) == crc32c_software(data)


@pytest.mark.parametrize("kernel", KERNELS)
def test_non_contiguous_input_raises(kernel):
    strided = memoryview(random_bytes(64, seed=9))[::2]
    with pytest.raises((ValueError, TypeError, BufferError)):
        kernel(strided)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bad", [None, "text", 12])
def test_non_buffer_input_raises(kernel, bad):
    with pytest.raises((ValueError, TypeError, BufferError)):
        kernel(bad)
