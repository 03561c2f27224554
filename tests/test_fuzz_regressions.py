"""Inputs the fuzz harnesses (fuzz/) and the sanitizer build (`make asan`) found, kept as
regression tests next to their fixes."""

from __future__ import annotations

import os
import struct

import pytest

import mqcore
from mqcore._ext.batch import decode_messages, encode_batch, read_batch_info
from mqcore._ext.crc32c import crc32c
from mqcore.errors import CorruptIndexError, CorruptRecordError, InvalidMessageIdError
from mqcore.query.ids import decode_msg_id, encode_msg_id, parse_uid
from mqcore.storage.logdir import RECOVERY_CHECKPOINT, LogDirectory

# fuzz_logdir: a checkpoint that is not UTF-8 escaped the parser as UnicodeDecodeError, so the
# store failed to open instead of recovering from the log
NOT_UTF8_CHECKPOINT = b"0\n1\nt 0 5\xff\n"


def test_checkpoint_not_utf8_is_a_corrupt_index(tmp_path: str) -> None:
    mqcore.open(str(tmp_path)).close()  # an empty store: a read-only LogDirectory needs one
    directory = LogDirectory(str(tmp_path), writable=False)
    with open(os.path.join(str(tmp_path), RECOVERY_CHECKPOINT), "wb") as f:
        f.write(NOT_UTF8_CHECKPOINT)
    with pytest.raises(CorruptIndexError, match=RECOVERY_CHECKPOINT):
        directory.load_recovery_points()


def test_store_with_a_checkpoint_not_utf8_recovers(store_path: str) -> None:
    with mqcore.open(store_path) as store:
        store.create_topic("t")
        for i in range(5):
            store.append("t", b"v%d" % i)
    with open(os.path.join(store_path, RECOVERY_CHECKPOINT), "wb") as f:
        f.write(NOT_UTF8_CHECKPOINT)
    with mqcore.open(store_path) as store:
        assert [m.value for m in store.read("t", 0, 0, 10)] == [b"v%d" % i for i in range(5)]


# fuzz_ids: the 10th byte of the offset's varint had bits past 64 set (0x41 for 0x01); decoding
# drops them, so the ID decoded although it is not the canonical text of its message
NON_CANONICAL_STORE_ID = "m1-mA-666667K6A6K5BdA"


def test_store_id_with_overflowing_varint_is_rejected() -> None:
    with pytest.raises(InvalidMessageIdError, match="canonical"):
        decode_msg_id(NON_CANONICAL_STORE_ID)
    canonical = encode_msg_id("t", 972, 6298284883708336861)
    assert canonical != NON_CANONICAL_STORE_ID
    assert decode_msg_id(canonical) == ("t", 972, 6298284883708336861)


# make asan (UBSan): offset and timestamp sums on header fields read from a file were C signed
# overflows (undefined behaviour). Offsets that cannot fit are now rejected; timestamps wrap as
# Kafka's Java readers do.
INT64_MAX = (1 << 63) - 1


def _patched(data: bytes, base_offset: int | None = None, base_ts: int | None = None) -> bytes:
    """The batch with baseOffset / baseTimestamp replaced and its CRC recomputed."""
    b = bytearray(data)
    if base_offset is not None:
        struct.pack_into(">q", b, 0, base_offset)
    if base_ts is not None:
        struct.pack_into(">q", b, 27, base_ts)
    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    return bytes(b)


def _two_records() -> bytes:
    eb = encode_batch([b"a", b"b"], timestamps=[1000, 1001])
    eb.set_base_offset(0)
    return eb.tobytes()


def test_base_offset_whose_last_offset_overflows_is_corrupt() -> None:
    data = _two_records()
    bad = _patched(data, base_offset=INT64_MAX - 1)
    with pytest.raises(CorruptRecordError, match="overflows"):
        read_batch_info(bad, 0, True)
    with pytest.raises(CorruptRecordError, match="overflows"):
        decode_messages(bad, 0, "t", 0, 0, 10, [], True)
    # the largest base offset that fits still decodes
    out: list = []
    decode_messages(_patched(data, base_offset=INT64_MAX - 2), 0, "t", 0, 0, 10, out, True)
    assert [m.offset for m in out] == [INT64_MAX - 2, INT64_MAX - 1]


def test_timestamp_delta_past_int64_wraps() -> None:
    data = _two_records()
    out: list = []
    decode_messages(_patched(data, base_ts=INT64_MAX), 0, "t", 0, 0, 10, out, True)
    assert [m.timestamp for m in out] == [INT64_MAX, -(1 << 63)]


# fuzz_ids (smoke run): bytes.fromhex skips whitespace, so 32 characters with spaces passed the
# length check and parsed to fewer than 16 bytes
def test_unique_id_with_spaces_is_rejected() -> None:
    with pytest.raises(InvalidMessageIdError, match="non-hex"):
        parse_uid("01a2 52 513ec9877f0bd4c2e68783cd")
    assert len(parse_uid("01a2f52a513ec9877f0bd4c2e68783cd")) == 16


# fuzz_recovery (with -malloc_limit_mb): recovery asked whether a whole batch starts inside a
# torn tail by reading `12 + batchLength` bytes, the length taken from the damaged bytes, so a
# tail holding a header that claims 2 GiB made os.pread allocate 2 GiB (MemoryError under an
# address-space limit; a 0.5 s open under ASan, which poisons the shadow of every large block)
HUGE_LENGTH = 0x7FFFFFF0


def _torn_with_huge_header(path: str) -> tuple[str, int, int]:
    """A store whose last batch is torn and holds a batch header claiming HUGE_LENGTH bytes;
    returns (log path, where the torn batch starts, bytes left of it)."""
    with mqcore.open(path, flush="os") as store:
        store.create_topic("t")
        for i in range(3):
            store.append("t", b"value %d" % i * 20, timestamp=1000 + i)
    log = os.path.join(path, "t-0", "00000000000000000000.log")
    with open(log, "rb") as f:
        data = f.read()
    last = 0
    while True:
        info = read_batch_info(data, last, True)
        if last + info.size == len(data):
            break
        last += info.size
    torn = bytearray(data[:-1])
    fake = struct.pack(">qi", 0, HUGE_LENGTH) + bytes(4) + b"\x02"  # magic at byte 16
    torn[last + 20 : last + 20 + len(fake)] = fake
    with open(log, "wb") as f:
        f.write(torn)
    os.unlink(os.path.join(path, "mqcore-clean-shutdown"))
    return log, last, len(torn) - last


@pytest.mark.parametrize("read_only", [False, True])
def test_recovery_never_reads_a_length_from_a_torn_tail(
    store_path: str, read_only: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, last, torn_bytes = _torn_with_huge_header(store_path)
    size = os.path.getsize(log)
    asked: list[int] = []
    real_pread = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        asked.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    with mqcore.open(store_path, read_only=read_only, flush="os") as store:
        assert store.recovery[("t", 0)].truncated_bytes == torn_bytes
        assert [m.value for m in store.read("t", 0, 0, 10)] == [b"value 0" * 20, b"value 1" * 20]
    assert asked and max(asked) <= size + 61  # a chunk of the file plus one batch header
    assert os.path.getsize(log) == (size if read_only else last)
