"""Files voxrelay writes for users to read or take elsewhere get the mode every other new file gets from the umask
(0644 under the usual 022), not 0600 (issue 32 item 7): safetensors creates `model.safetensors` 0600, and a
local file written atomically through a temporary file was 0600 too (config.yaml, usage.json, eval results)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.unit.models.test_family import tiny
from voxrelay import storage
from voxrelay.codecs.pcm import PcmCodec
from voxrelay.inference import export


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_exports_and_run_folder_files_follow_the_umask(umask: int, tmp_path: Path) -> None:
    old = os.umask(umask)
    try:
        export(tiny(), PcmCodec(16000), tmp_path / "export")  # model.safetensors written by safetensors
        run = str(tmp_path / "run")
        storage.write_text(storage.join(run, "config.yaml"), "name: x\n")  # atomic: through a temporary file
        storage.write_json(storage.join(run, "usage.json"), {"sessions": []})
        storage.create_new(storage.join(run, "lease.json"), b"{}")  # conditional writes (the run lease)
    finally:
        os.umask(old)
    modes = {p.relative_to(tmp_path).as_posix(): oct(stat.S_IMODE(p.stat().st_mode))
             for p in tmp_path.rglob("*") if p.is_file()}
    assert "export/model.safetensors" in modes and "run/config.yaml" in modes
    assert modes == dict.fromkeys(modes, oct(0o666 & ~umask))
