"""The scale bench, small (bench/scale_loader.py): a reader's peak memory does not grow with the corpus. Two local
corpora of full-length DAC codes (86 Hz x 9 codebooks), 10 h (~60 MB) and 40 h (~240 MB): streaming them, a
process's peak RSS differs by a few MB (the row index and plan, ~200 bytes a row), where holding the rows in
memory, as the loader did before streaming, would add the ~180 MB of codes."""

from __future__ import annotations

import pytest

from bench import scale_loader as bench

pytestmark = pytest.mark.slow  # tiers: see tests/conftest.py


def test_peak_memory_of_the_streaming_reader_does_not_grow_with_the_corpus(tmp_path):
    results = {}
    for hours in (10, 40):
        uri = str(tmp_path / f"corpus-{hours}h")
        index = bench.write_dataset(uri, hours, frames_div=1)
        results[hours] = bench.run_measure(uri, 40, str(tmp_path / f"cache-{hours}"), cache_gb=0.5, ram_gb=0.03)
        results[hours]["rows_codes_mb"] = index["hours"] * 3600 * bench.FRAME_RATE * bench.K * 2 / 2**20  # int16
    small, big = results[10], results[40]
    grown = big["rss_mb"] - small["rss_mb"]
    more_codes = big["rows_codes_mb"] - small["rows_codes_mb"]
    assert more_codes > 150, results  # what an in-memory loader would have added
    assert grown < 30 + 200 * (big["rows"] - small["rows"]) / 2**20, results
