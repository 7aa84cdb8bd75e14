"""Shards keep each codec's codes exactly: int16 by default, int32 for a codec that declares it (XCodec2 and NeuCodec
have 65,536 codes), float32 features; codes a dtype cannot hold are refused, never wrapped; an older shard (no dtype
in its metadata) reads as int16."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from voxrelay.data import shards as sh


def rows(codes: np.ndarray, prompts: tuple = ()) -> list[sh.EncodedUtterance]:
    return [sh.EncodedUtterance(id="a", text="t", speaker=None, description=None, duration=1.0, codes=codes,
                                voice_prompts=prompts)]


@pytest.mark.parametrize("size, dtype", [(4096, "int16"), (32768, "int16"), (65536, "int32")])
def test_codes_of_any_codebook_size_round_trip_exactly(size: int, dtype: str) -> None:
    from voxrelay.codecs.neucodec import NeuCodecCodec
    from voxrelay.codecs.xcodec2 import Xcodec2Codec

    codes = np.random.default_rng(0).integers(0, size, (1, 50))
    codes[0, :2] = [0, size - 1]
    codec = SimpleNamespace(codebook_size=size, **({"stored_dtype": "int32"} if size > 32768 else {}))
    stored = sh.stored_array(codes, codec)
    assert stored.dtype == dtype
    back = sh.decode_table(sh.encode_table(rows(stored, (stored[:, :5],))), 1)[0]
    assert back.codes.dtype == dtype and np.array_equal(back.codes.astype(np.int64), codes)
    assert np.array_equal(back.voice_prompts[0].astype(np.int64), codes[:, :5])
    assert Xcodec2Codec.stored_dtype == NeuCodecCodec.stored_dtype == "int32"


def test_codes_int16_cannot_hold_are_refused_not_wrapped() -> None:
    with pytest.raises(ValueError, match="int16 cannot hold"):
        sh.stored_array(np.array([[0, 65535]]), SimpleNamespace(name="wide", codebook_size=65536))
    pcm = np.array([[-32768, 32767]])  # PCM samples: 65,536 values that int16 holds
    assert sh.stored_array(pcm, SimpleNamespace(codebook_size=65536)).dtype == np.int16


def test_a_shard_without_a_dtype_in_its_metadata_reads_as_int16() -> None:
    data = sh.encode_table(rows(np.arange(10, dtype=np.int16).reshape(1, 10)))
    import io

    import pyarrow.parquet as pq

    assert sh.DTYPE_KEY not in (pq.read_table(io.BytesIO(data)).schema.metadata or {})
    assert sh.decode_table(data, 1)[0].codes.dtype == np.int16


def test_shards_keep_conversation_and_turn_and_read_older_shards_without_them():
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from voxrelay.data import shards as sh

    rows = [sh.EncodedUtterance("a", "hi", None, None, 1.0, np.zeros((2, 3), np.int16), conversation="t", turn=4),
            sh.EncodedUtterance("b", "yo", None, None, 1.0, np.zeros((2, 3), np.int16))]
    back = sh.decode_table(sh.encode_table(rows), 2)
    assert [(r.conversation, r.turn) for r in back] == [("t", 4), (None, None)]
    table = pq.read_table(io.BytesIO(sh.encode_table(rows))).drop_columns(["conversation", "turn"])
    older = io.BytesIO()
    pq.write_table(pa.table(table.to_pydict()), older)  # a shard written before the columns existed
    assert [(r.id, r.conversation, r.turn) for r in sh.decode_table(older.getvalue(), 2)] == [("a", None, None),
                                                                                              ("b", None, None)]
