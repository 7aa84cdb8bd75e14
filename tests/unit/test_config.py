import pytest

from voxrelay.cli import demo_config_path
from voxrelay.config import ConfigError, RunConfig, apply_overrides, load_config, parse_duration


def test_defaults_are_valid_and_paths_follow_layout():
    cfg = RunConfig()
    assert cfg.prepared_uri.endswith("/prepared/demo")
    assert cfg.run_uri.endswith("/runs/demo")


def test_public_override_keys(tmp_path):
    cfg = load_config(
        demo_config_path(),
        ["root=s3://bucket/x", "name=exp1", "train.max_steps=7", "train.seed=3", "checkpoint.every_steps=2"],
    )
    assert (cfg.root, cfg.name, cfg.train.max_steps, cfg.train.seed, cfg.checkpoint.every_steps) == (
        "s3://bucket/x", "exp1", 7, 3, 2)
    assert cfg.run_uri == "s3://bucket/x/runs/exp1"
    assert cfg.prepared_uri == "s3://bucket/x/prepared/demo"


def test_override_values_are_typed():
    data = apply_overrides({}, ["train.lr=1e-4", "monitor.tensorboard=false", "name=123", "train.clip_norm=null"])
    assert data == {"train": {"lr": 1e-4, "clip_norm": None}, "monitor": {"tensorboard": False}, "name": "123"}


def test_one_item_of_a_list_overridden_says_how_to_give_the_list():
    """A user's walk: `data.sources.0.path=...` said only "'sources' is a value, not a section"."""
    with pytest.raises(ConfigError, match=r"a list is given whole, in YAML: 'data.sources=\[...\]'"):
        load_config(None, ["data.sources.0.path=/data/mine"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("train.max_steps=-5", "train.max_steps"),
        ("train.lr=fast", "train.lr"),
        ("train.precision=fp8", "train.precision"),
        ("trian.max_steps=5", "unknown key"),
        ("model.hidden_size=130", "divisible by num_heads"),
        ("checkpoint.keep_last=1", "checkpoint.keep_last"),
        ("train.time_limit=soon", "not a duration"),
        ("train.optimizer=sgd", "train.optimizer"),
        ("train.betas=[0.9, 1.0]", "train.betas"),
        ("train.eps=0", "train.eps"),
        ("train.schedule=cosine_with_restarts", "train.schedule"),
    ],
)
def test_bad_values_name_key_value_and_fix(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert expected in msg
    assert override.split("=")[1] in msg or "unknown key" in msg


@pytest.mark.parametrize(("override", "expected"), [
    ("train.max_stepz=3", "train.max_stepz: unknown key; did you mean train.max_steps?"),
    ("trian.max_steps=5", "trian: unknown key; did you mean train?"),
    ("model.hidden_sise=4", "model.hidden_sise: unknown key; did you mean model.hidden_size?"),  # a family's key
    ('data.sources=[{"type": "folder", "pathh": "x"}]', "data.sources.0.pathh: unknown key; did you mean "
                                                         "data.sources.0.path?"),
    ("zzz=1", "zzz: unknown key; check the spelling"),  # nothing near: no guess
])
def test_an_unknown_key_names_the_nearest_known_one(override, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert expected in str(info.value), str(info.value)


def test_both_batch_budgets_is_an_error():
    with pytest.raises(ConfigError, match="exactly one of batch_seconds or batch_tokens"):
        load_config(None, ["train.batch_seconds=30"])
    assert load_config(None, ["train.batch_seconds=30", "train.batch_tokens=null"]).train.batch_seconds == 30


def test_source_needs_path():
    with pytest.raises(ConfigError, match="needs `path`"):
        load_config(None, ["data.sources=[{type: folder}]"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not key=value"):
        load_config(None, ["train.max_steps"])


def test_durations():
    assert parse_duration("23h30m") == 23 * 3600 + 1800
    assert parse_duration("90s") == 90
    assert parse_duration(12) == 12.0


def test_hash_changes_with_content():
    assert RunConfig().hash() == RunConfig().hash()
    assert RunConfig().hash() != load_config(None, ["train.lr=0.5"]).hash()


def test_generated_reference_pages_are_current():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parents[2]
    spec = importlib.util.spec_from_file_location("update_reference", root / "scripts" / "update_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert {p.name for p in mod.PAGES} == {"config.md", "cli.md"}
    for page, blocks in mod.PAGES.items():
        text = page.read_text()
        assert mod.render(text, blocks) == text, f"{page}: run .venv/bin/python scripts/update_reference.py"


def test_resume_changes_are_classified():
    from voxrelay.config import config_changes

    old = RunConfig().to_dict()
    new = load_config(None, ["train.max_steps=5", "checkpoint.keep_last=4", "monitor.tensorboard=false",
                             "model.hidden_size=128", "train.lr=0.1", "codec.num_codebooks=2"]).to_dict()
    safe, bad = config_changes(old, new)
    assert safe == ["checkpoint.keep_last", "monitor.tensorboard", "train.max_steps"]
    assert bad == ["codec.num_codebooks", "model.hidden_size", "train.lr"]
    assert config_changes(old, old) == ([], [])


def test_optimizer_and_schedule_changes_are_incompatible_on_resume():
    # the saved optimizer state cannot be loaded into another optimizer; betas/eps/schedule change the
    # trajectory like lr does, so a resumed run would not continue as if uninterrupted
    from voxrelay.config import config_changes

    old = RunConfig().to_dict()
    for override in ("train.optimizer=adafactor", "train.betas=[0.9,0.999]", "train.eps=1e-6",
                     "train.schedule=linear"):
        key = override.split("=")[0]
        assert config_changes(old, load_config(None, [override]).to_dict()) == ([], [key])


def test_config_saved_before_a_key_existed_still_resumes():
    # a checkpoint written before train.optimizer/betas/eps existed ran AdamW (0.9, 0.95), eps 1e-8
    from voxrelay.config import config_changes

    old = RunConfig().to_dict()
    for key in ("optimizer", "betas", "eps"):
        del old["train"][key]
    assert config_changes(old, RunConfig().to_dict()) == ([], [])
    assert config_changes(old, load_config(None, ["train.optimizer=adamw_8bit"]).to_dict()) == (
        [], ["train.optimizer"])


def test_precision_no_survives_yaml(tmp_path):
    # YAML 1.1 reads a bare `no` as false: the documented value must still work in files and overrides
    assert load_config(None, ["train.precision=no"]).train.precision == "no"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  precision: no\n")
    assert load_config(cfg).train.precision == "no"


def test_reference_has_one_model_table_per_family():
    from typing import Literal, Union

    from pydantic import BaseModel

    from voxrelay.config.reference import _sections_of, reference_markdown

    text = reference_markdown()
    assert "**model** (when `model.family: codec_lm`)" in text
    assert "| `model.family` | `\"codec_lm\"` |" in text and "| `model.hidden_size` | `256` |" in text

    class Other(BaseModel):
        family: Literal["other"] = "other"

    assert _sections_of(Union[RunConfig, Other]) == [RunConfig, Other]  # noqa: UP007 (what pydantic hands over)
    assert _sections_of(RunConfig) == [RunConfig]
    assert _sections_of(list[Other]) == [] and _sections_of(int) == []


def test_lora_is_off_by_default_and_each_key_defaults_to_the_familys():
    assert RunConfig().train.lora is None
    lora = load_config(None, ["train.lora.r=16"]).train.lora  # the dotted override creates the section
    assert lora is not None and lora.r == 16
    assert {k: getattr(lora, k) for k in type(lora).model_fields if k != "r"} == dict.fromkeys(
        ["alpha", "dropout", "rslora", "target_modules", "modules_to_save", "base_bits"]) | {"embeddings": "new_rows"}
    assert load_config(None, ["train.lora=true"]).train.lora == load_config(None, ["train.lora={}"]).train.lora
    assert load_config(None, ["train.lora=true"]).train.lora.r is None
    # turned on, then a key of it set, in either order (a user's walk: the second order said "'lora' is a value")
    for order in (["train.lora=true", "train.lora.base_bits=4"], ["train.lora.base_bits=4", "train.lora=true"]):
        assert load_config(None, order).train.lora.base_bits == 4, order
    assert load_config(None, ["train.lora.r=8", "train.lora=null"]).train.lora is None
    lists = load_config(None, ["train.lora.target_modules=[q_proj, v_proj]", "train.lora.modules_to_save=[]"])
    assert (lists.train.lora.target_modules, lists.train.lora.modules_to_save) == (["q_proj", "v_proj"], [])


def test_lora_section_from_yaml(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("train:\n  lora: {}\n")
    assert load_config(cfg).train.lora.model_dump() == dict.fromkeys(
        ["r", "alpha", "dropout", "rslora", "target_modules", "modules_to_save", "base_bits"]) | {
            "embeddings": "new_rows"}
    cfg.write_text("train:\n  lora: null\n")  # off in the file, on from the command line
    assert load_config(cfg).train.lora is None
    assert load_config(cfg, ["train.lora.r=16", "train.lora.dropout=0.1"]).train.lora.dropout == 0.1


@pytest.mark.parametrize(("override", "key"), [("train.lora.r=0", "train.lora.r"), ("train.lora.dropout=1.5",
                         "train.lora.dropout"), ("train.lora.rank=8", "train.lora.rank: unknown key")])
def test_bad_lora_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])


def test_lora_changes_are_incompatible_on_resume():
    from voxrelay.config import config_changes

    full = RunConfig().to_dict()
    lora = load_config(None, ["train.lora.r=16"]).to_dict()
    assert config_changes(full, lora)[1] and config_changes(lora, full)[1]  # turning it on or off
    assert config_changes(lora, load_config(None, ["train.lora.r=8"]).to_dict()) == ([], ["train.lora.r"])
    # a checkpoint written before train.lora existed resumes as a full fine-tune
    old = RunConfig().to_dict()
    del old["train"]["lora"]
    assert config_changes(old, full) == ([], [])


def test_code_vector_inputs_are_refused_with_lora():
    with pytest.raises(ConfigError, match=r"set model.audio_embedding=free to train with train.lora"):
        load_config(demo_config_path(), ["train.lora={}"])  # the demo embeds audio through code vectors
    cfg = load_config(demo_config_path(), ["train.lora={}", "model.audio_embedding=free"])
    assert cfg.train.lora is not None and cfg.model.audio_embedding == "free"
