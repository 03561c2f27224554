"""Fuzz the store-ID and unique-ID decoders (mqcore.query.ids). A decoded ID must re-encode to
the same text: IDs are canonical, one per message."""

from __future__ import annotations

import fuzzcommon
from fuzzcommon import EXPECTED

ids = fuzzcommon.mqcore.query.ids


def test_one_input(data: bytes) -> None:
    text = data.decode("utf-8", "surrogateescape")
    for candidate in (text, ids.STORE_ID_PREFIX + text):
        try:
            topic, partition, offset = ids.decode_msg_id(candidate)
        except EXPECTED:
            pass
        else:
            assert ids.encode_msg_id(topic, partition, offset) == candidate, candidate
        try:
            raw = ids.parse_uid(candidate)
        except EXPECTED:
            pass
        else:
            assert len(raw) == 16
            assert ids.parse_uid(ids.uid_text(raw)) == raw
            ids.uid_time_ms(raw)
        assert ids.id_kind(candidate) in ("store", "unique")
    ids.uid_time_ms(data)


if __name__ == "__main__":
    fuzzcommon.run(test_one_input)
