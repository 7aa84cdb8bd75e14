"""Sweep files: grid x list expansion, stable run names, values that reach `voxrelay train` unchanged, and
the errors (exit 2) that name the file, the key and the fix."""

from __future__ import annotations

import pytest
import yaml

from voxrelay.config import ConfigError, apply_overrides, load_config
from voxrelay.sweep.spec import SweepError, expand, experiment_name, format_value, load_sweep
from voxrelay.sweep.worker import settings

GRID = {"train.lr": [1.0e-4, 5.0e-5, 1.0e-5], "train.optimizer": ["adamw", "lion"]}


def _write(tmp_path, data, name="lr.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return str(path)


def test_grid_times_list_in_order():
    sets = expand({"grid": GRID, "list": [{"model.dropout": 0.1}, {"train.warmup_steps": 5}]}, "x")
    assert len(sets) == 12
    assert sets[0] == {"train.lr": 1.0e-4, "train.optimizer": "adamw", "model.dropout": 0.1}
    assert sets[5] == {"train.lr": 1.0e-5, "train.optimizer": "lion", "model.dropout": 0.1}
    assert sets[6] == {"train.lr": 1.0e-4, "train.optimizer": "adamw", "train.warmup_steps": 5}
    assert expand({"list": [{"train.lr": 3.0e-4}, {"train.lr": 1.0e-4}]}, "x") == [{"train.lr": 3.0e-4},
                                                                                    {"train.lr": 1.0e-4}]
    assert len(expand({"grid": GRID}, "x")) == 6


def test_names_are_stable_unique_and_usable_run_names(tmp_path):
    a = experiment_name("lr", {"train.lr": 1.0e-4, "train.optimizer": "lion"})
    assert a == experiment_name("lr", {"train.optimizer": "lion", "train.lr": 0.0001})  # order, spelling
    assert a != experiment_name("lr", {"train.lr": 1.0e-5, "train.optimizer": "lion"})
    assert a.startswith("lr-lr-0.0001-optimizer-lion-")
    names = {experiment_name("g", s) for s in expand({"grid": GRID}, "x")}
    assert len(names) == 6
    for name in names:  # the config accepts each as a run name
        assert load_config(None, [f"root={tmp_path}", f"name={name}"]).run_uri.endswith(f"/runs/{name}")


@pytest.mark.parametrize("value", [1.0e-4, 5.0e-5, 0.1, 3, True, None, "lion", [1, 2], {"a": 1}])
def test_values_reach_the_config_unchanged(value):
    assert apply_overrides({}, [f"k={format_value(value)}"])["k"] == value


def test_exponents_written_without_a_dot_are_numbers(tmp_path):
    (tmp_path / "base.yaml").write_text("train: {max_steps: 2}\n")
    source = _write(tmp_path, "base: base.yaml\ngrid:\n  train.lr: [1e-4, 5e-5]\n")
    lrs = [e.overrides["train.lr"] for e in load_sweep(source).experiments]
    assert lrs == [1.0e-4, 5.0e-5]


def test_base_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "base.yaml").write_text("train: {max_steps: 2}\n")
    source = _write(tmp_path / "cfg", {"base": "base.yaml", "grid": GRID})
    sweep = load_sweep(source, ["root=/x"])
    assert sweep.base == str(tmp_path / "cfg" / "base.yaml") and sweep.name == "lr" and sweep.overrides == ("root=/x",)
    absolute = str(tmp_path / "cfg" / "base.yaml")
    assert load_sweep(_write(tmp_path, {"base": absolute, "name": "mine", "grid": GRID})).name == "mine"


def test_two_sweeps_of_one_name_over_different_bases_share_no_run(tmp_path):
    """(issue 33 W4) The run name carries the base config's content: another base is another run folder; the
    same content (other layout, other root/name, other place) is the same run, so later sessions resume it."""
    for folder, text in {"a": "train: {max_steps: 2, lr: 1.0e-4}\n", "b": "train: {max_steps: 50, lr: 1.0e-4}\n",
                         "c": "# a comment\nname: other\nroot: /elsewhere\ntrain:\n  lr: 0.0001\n  max_steps: 2\n"
                         }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "base.yaml").write_text(text)
        _write(tmp_path / folder, {"base": "base.yaml", "name": "lr", "grid": GRID})
    a, b, c = (load_sweep(str(tmp_path / f / "lr.yaml")) for f in "abc")
    assert not {e.name for e in a.experiments} & {e.name for e in b.experiments}
    assert [e.name for e in a.experiments] == [e.name for e in c.experiments]
    assert all(e.name.startswith("lr-lr-") for e in a.experiments)


def test_a_sweep_whose_base_is_missing_names_it(tmp_path):
    source = _write(tmp_path, {"base": "nope.yaml", "grid": GRID})
    with pytest.raises(ConfigError) as info:
        load_sweep(source)
    assert "nope.yaml" in str(info.value) and "does not exist" in str(info.value)


@pytest.mark.parametrize("data, words", [
    ({"grid": GRID}, "`base`"),
    ({"base": "b.yaml"}, "no experiments"),
    ({"base": "b.yaml", "grid": {"train.lr": 1.0e-4}}, "must list its values"),
    ({"base": "b.yaml", "grid": {"train.lr": []}}, "must list its values"),
    ({"base": "b.yaml", "grid": GRID, "list": [{"train.lr": 3.0e-4}]}, "which the grid varies too"),
    ({"base": "b.yaml", "list": {"train.lr": 3.0e-4}}, "must be a list"),
    ({"base": "b.yaml", "list": [{"train.lr": 1.0}, {"train.lr": 1.0}]}, "listed twice"),
    ({"base": "b.yaml", "grid": GRID, "runs": 3}, "unknown key(s) runs"),
    ({"base": "b.yaml", "grid": GRID, "name": "a/b"}, "sweep name 'a/b'"),
])
def test_bad_sweep_files_name_the_problem(tmp_path, data, words):
    source = _write(tmp_path, data)
    with pytest.raises(SweepError) as info:
        load_sweep(source)
    assert words in str(info.value) and source in str(info.value)


def test_a_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SweepError, match="does not exist"):
        load_sweep(str(tmp_path / "nope.yaml"))
    with pytest.raises(SweepError, match="not valid YAML"):
        load_sweep(_write(tmp_path, "base: [unclosed\n"))


def test_every_experiment_config_is_checked_before_training(tmp_path):
    from voxrelay.cli import demo_config_path

    good = {"base": str(demo_config_path()), "grid": {"train.lr": [1.0e-4]}}
    assert settings(load_sweep(_write(tmp_path, good), [f"root={tmp_path}"])).root == str(tmp_path)
    bad = {"base": str(demo_config_path()), "list": [{"train.lr": 1.0e-4}, {"train.lrr": 1.0e-4}]}
    with pytest.raises(SweepError) as info:
        settings(load_sweep(_write(tmp_path, bad), [f"root={tmp_path}"]))
    assert "experiment lrr=0.0001" in str(info.value) and "train.lrr" in str(info.value)
    with pytest.raises(SweepError, match="sets root or name"):
        settings(load_sweep(_write(tmp_path, {"base": good["base"], "list": [{"name": "x"}]})))


def test_the_example_sweep_is_valid(tmp_path):
    from pathlib import Path

    example = Path(__file__).parents[3] / "examples" / "lr-sweep.yaml"
    sweep = load_sweep(str(example), [f"root={tmp_path}"])
    assert len(sweep.experiments) == 6 and sweep.name == "lr-sweep"
    assert settings(sweep).root == str(tmp_path)  # every experiment's config builds
