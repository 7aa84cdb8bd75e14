"""A config read from the bucket (gs://, s3://) as from a local file: what a Colab notebook or a spot job trains
from. Against the real test servers on 127.0.0.1."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from voxrelay import storage
from voxrelay.cli import app
from voxrelay.config import ConfigError, load_config

YAML = "name: from-bucket\ntrain:\n  max_steps: 7\n"


@pytest.mark.parametrize("root_fixture", ["gcs_root", "s3_root"])
def test_config_in_the_bucket_loads_with_overrides(root_fixture, request):
    root = request.getfixturevalue(root_fixture)
    uri = storage.join(root, "configs", "x.yaml")
    storage.write_text(uri, YAML)
    cfg = load_config(uri, [f"root={root}", "train.lr=0.002"])
    assert (cfg.name, cfg.root, cfg.train.max_steps, cfg.train.lr) == ("from-bucket", root, 7, 0.002)
    # the command line keeps the URI whole (a Path would make gs://b/x "gs:/b/x")
    res = CliRunner().invoke(app, ["config", "show", uri, "train.max_steps=9"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "name: from-bucket" in res.output and "max_steps: 9" in res.output


def test_missing_config_in_the_bucket_names_the_uri_and_the_fix(gcs_root):
    uri = storage.join(gcs_root, "configs", "nope.yaml")
    with pytest.raises(ConfigError) as err:
        load_config(uri)
    msg = str(err.value)
    assert f"config {uri!r} does not exist" in msg and f"gcloud storage cp my.yaml {uri}" in msg


def test_invalid_yaml_in_the_bucket_names_the_uri(s3_root):
    uri = storage.join(s3_root, "bad.yaml")
    storage.write_text(uri, "train: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"^{uri}: not valid YAML at line"):
        load_config(uri)


def test_local_config_still_named_as_before(tmp_path):
    with pytest.raises(ConfigError, match="config file .* does not exist; pass the path of a YAML file"):
        load_config(tmp_path / "missing.yaml")
