"""prepare on a folder with good and broken rows: good rows prepared, each bad one named with its
reason (rejects.jsonl + summary), no traceback; --strict fails on the first bad row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.datasets import BAD_ROWS, EXPECTED_REASONS, GOOD_ROWS, MAX_DURATION, Row, make_folder_dataset


def _run(tmp_path, *extra):
    dup = Row("d002", "Again.", 1.0, audio_path="audio/d001.wav")
    data = make_folder_dataset(tmp_path / "corpus", GOOD_ROWS + BAD_ROWS + [dup])
    config = tmp_path / "mixed.yaml"
    config.write_text(
        f"root: {tmp_path / 'bucket'}\n"
        f"data: {{name: mixed, sources: [{{type: folder, path: {data}}}], max_duration: {MAX_DURATION},"
        " eval_size: 1, max_reject_fraction: 1.0}\n"  # 9 of 12 rows are broken on purpose
        "codec: {num_codebooks: 2, codebook_size: 8}\n"
    )
    # a narrow terminal: the summary must still show every file, row, id and reason whole
    env = dict(os.environ, VOXRELAY_CACHE=str(tmp_path / "cache"), COLUMNS="80")
    return subprocess.run(
        [sys.executable, "-m", "voxrelay", "prepare", str(config), *extra],
        capture_output=True, text=True, env=env, timeout=300,
    )


def test_bad_rows_are_rejected_with_reasons(tmp_path):
    res = _run(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "Traceback" not in out
    prepared = tmp_path / "bucket/prepared/mixed"
    index = json.loads((prepared / "index.json").read_text())
    assert index["counts"]["train"] + index["counts"]["eval"] == len(GOOD_ROWS)
    rejects = [json.loads(x) for x in (prepared / "rejects.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rejects}
    for bad_id, reason in EXPECTED_REASONS.items():
        assert reason in by_id[bad_id]["reason"], by_id[bad_id]
        assert "metadata.csv row" in by_id[bad_id]["where"]
        row = by_id[bad_id]["where"].rsplit(" ", 1)[1]
        # one line per reject, `file:row id: reason`, the path relative to the dataset folder
        assert f"  metadata.csv:{row} {bad_id}: {by_id[bad_id]['reason']}\n" in res.stderr, res.stderr
    assert f"paths relative to {tmp_path / 'corpus'}:" in res.stderr
    assert "duplicate id 'd002'" in by_id["d002"]["reason"]
    assert index["counts"]["rejected"] == len(BAD_ROWS) + 1


def test_strict_fails_on_first_bad_row(tmp_path):
    res = _run(tmp_path, "--strict")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    named = [bad for bad, reason in EXPECTED_REASONS.items() if bad in res.stderr and reason in res.stderr]
    assert len(named) == 1, res.stderr  # the first bad row met, and only it
    assert "metadata.csv row" in res.stderr and "--strict" in res.stderr
    assert not (tmp_path / "bucket/prepared/mixed/index.json").exists()
