"""Batch encode and decode: mqcore's Cython codec against kafka-python's pure-Python one.

Both sides handle the same 1000 records of 100 B values with a key, one header and their own
timestamp. The decoders read the same bytes (built by kafka-python, so the input is not ours).
mqcore's decode also checks the CRC; kafka-python's iteration does not (it has a separate
validate_crc()), so the comparison favours kafka-python.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from benchdata import SEED, T0_MS, record, values_of
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from pytest_benchmark.fixture import BenchmarkFixture

from mqcore._ext.arrowcols import ArrowColumns
from mqcore._ext.batch import decode_messages, encode_batch
from mqcore.arrow import to_record_batch

RECORDS = 1000
VALUE_BYTES = 100


@dataclass
class CodecInput:
    """The records, and the batch kafka-python builds from them (the decoders' input)."""

    values: list[bytes]
    keys: list[bytes]
    headers: list[list[tuple[str, bytes]]]
    timestamps: list[int]
    encoded: bytes

    @property
    def payload_bytes(self) -> int:
        return sum(map(len, self.values)) + sum(map(len, self.keys))


def kafka_encode(data: CodecInput) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for i in range(RECORDS):
        builder.append(i, data.timestamps[i], data.keys[i], data.values[i], data.headers[i])
    return bytes(builder.build())


def mqcore_encode(data: CodecInput) -> bytes:
    batch = encode_batch(data.values, data.keys, data.headers, data.timestamps)
    batch.set_base_offset(0)
    return batch.tobytes()


def mqcore_decode(buf: bytes) -> list[object]:
    out: list[object] = []
    decode_messages(buf, 0, "t", 0, 0, RECORDS, out)
    return out


def kafka_decode(buf: bytes) -> list[object]:
    return list(DefaultRecordBatch(buf))


def arrow_decode(buf: bytes) -> object:
    cols = ArrowColumns(True)
    cols.add(buf, 0, 0)
    return to_record_batch(cols, "t", 0)


@pytest.fixture(scope="module")
def codec_input() -> CodecInput:
    rng = random.Random(SEED)
    values = values_of(RECORDS, VALUE_BYTES, SEED)
    keys = [b"user-%08d" % rng.randrange(10**8) for _ in range(RECORDS)]
    headers = [[("trace-id", rng.randbytes(16))] for _ in range(RECORDS)]
    timestamps = [T0_MS + i for i in range(RECORDS)]
    data = CodecInput(values, keys, headers, timestamps, b"")
    data.encoded = kafka_encode(data)
    return data


def test_codecs_agree(codec_input: CodecInput) -> None:
    """Both encoders make the same bytes (but the leader epoch: kafka-python writes 0, mqcore
    -1, Kafka's "none"), and every decoder reads back the records."""
    ours_encoded = mqcore_encode(codec_input)
    assert ours_encoded[:12] == codec_input.encoded[:12]
    assert ours_encoded[16:] == codec_input.encoded[16:]
    ours = mqcore_decode(codec_input.encoded)
    theirs = kafka_decode(codec_input.encoded)
    assert [(m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in ours] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs
    ]
    batch = arrow_decode(codec_input.encoded)
    assert batch.column("value").to_pylist() == codec_input.values


def _run(
    benchmark: BenchmarkFixture,
    data: CodecInput,
    case: str,
    fn: Callable[[object], object],
    arg: object,
    rounds: int,
    iterations: int,
) -> None:
    record(
        benchmark,
        case,
        nbytes=len(data.encoded),
        messages=RECORDS,
        ops=1,
        payload_bytes=data.payload_bytes,
    )
    benchmark.pedantic(fn, args=(arg,), rounds=rounds, iterations=iterations, warmup_rounds=2)


def test_encode_mqcore(benchmark: BenchmarkFixture, codec_input: CodecInput) -> None:
    """encode_batch(values, keys, headers, timestamps).tobytes(): a whole batch as bytes."""
    benchmark.group = "codec-encode"
    _run(benchmark, codec_input, "encode/mqcore", mqcore_encode, codec_input, 200, 10)


def test_encode_kafka_python(benchmark: BenchmarkFixture, codec_input: CodecInput) -> None:
    """DefaultRecordBatchBuilder.append x 1000 + build()."""
    benchmark.group = "codec-encode"
    _run(benchmark, codec_input, "encode/kafka-python", kafka_encode, codec_input, 30, 1)


def test_decode_mqcore(benchmark: BenchmarkFixture, codec_input: CodecInput) -> None:
    """decode_messages: CRC check + 1000 Message objects."""
    benchmark.group = "codec-decode"
    _run(benchmark, codec_input, "decode/mqcore", mqcore_decode, codec_input.encoded, 200, 10)


def test_decode_mqcore_arrow(benchmark: BenchmarkFixture, codec_input: CodecInput) -> None:
    """ArrowColumns.add + to_record_batch: CRC check + Arrow buffers, headers included."""
    benchmark.group = "codec-decode"
    _run(benchmark, codec_input, "decode/mqcore-arrow", arrow_decode, codec_input.encoded, 200, 10)


def test_decode_kafka_python(benchmark: BenchmarkFixture, codec_input: CodecInput) -> None:
    """list(DefaultRecordBatch(buf)): 1000 DefaultRecord objects (no CRC check)."""
    benchmark.group = "codec-decode"
    _run(benchmark, codec_input, "decode/kafka-python", kafka_decode, codec_input.encoded, 30, 1)
