"""Resuming a run under another ``train.shuffle_window`` or ``train.packing``: refused only when the batch plan
or the packing would differ."""

import pytest

from voxrelay.config import ConfigError, RunConfig
from voxrelay.train import state as st
from voxrelay.train.resume import check_compatible


def _index(shards: int) -> dict:
    return {"shards": [{"name": f"train-{i:05d}", "split": "train"} for i in range(shards)]
            + [{"name": "eval-00000", "split": "eval"}]}


def _saved(window: int | None) -> dict:
    cfg = RunConfig().to_dict()
    if window is None:
        del cfg["train"]["shuffle_window"]  # a checkpoint written before windows existed: the global shuffle
    else:
        cfg["train"]["shuffle_window"] = window
    return {st.K_CONFIG: cfg}


@pytest.mark.parametrize(("saved", "now", "shards", "ok"), [
    (None, 64, 10, True),  # older run, small data: window 64 is still the global shuffle
    (None, 64, 100, False),  # older run on 100 shards: the new default would change its batch order
    (None, 0, 100, True),
    (8, 8, 100, True),
    (8, 16, 100, False),
    (200, 0, 100, True),  # both the global shuffle
])
def test_a_changed_shuffle_window_is_refused_only_when_the_plan_changes(saved, now, shards, ok):
    cfg = RunConfig.model_validate(RunConfig().to_dict() | {"train": RunConfig().to_dict()["train"]
                                                             | {"shuffle_window": now}})
    if ok:
        check_compatible(_saved(saved), cfg, _index(shards), 10, 1)
    else:
        with pytest.raises(ConfigError, match="train.shuffle_window"):
            check_compatible(_saved(saved), cfg, _index(shards), 10, 1)


def _packing_cfg(setting) -> RunConfig:
    data = RunConfig().to_dict()
    return RunConfig.model_validate(data | {"train": data["train"] | {"packing": setting}})


@pytest.mark.parametrize(("saved", "now", "can_pack", "ok"), [
    ("auto", True, True, True),  # the family packs: auto was already true
    ("auto", False, True, False),
    ("auto", False, False, True),  # a family that cannot pack: auto was already false
    (None, "auto", True, False),  # saved before the key: unpacked; auto would pack this family now
    (None, "auto", False, True),
    (None, False, True, True),
    (True, "auto", True, True),
])
def test_a_changed_packing_setting_is_refused_only_when_packing_changes(saved, now, can_pack, ok):
    old = _saved(0)
    if saved is None:
        del old[st.K_CONFIG]["train"]["packing"]
    else:
        old[st.K_CONFIG]["train"]["packing"] = saved
    if ok:
        check_compatible(old, _packing_cfg(now), _index(3), 10, 1, can_pack)
    else:
        was = saved or False  # a run saved before the key was unpacked
        with pytest.raises(ConfigError, match=rf"train.packing {was!r} -> {now!r}.*train.packing={was}"):
            check_compatible(old, _packing_cfg(now), _index(3), 10, 1, can_pack)
