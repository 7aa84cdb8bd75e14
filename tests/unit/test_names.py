"""`name` and `data.name` become folder names under the root: neither may leave it."""

import pytest

from voxrelay.config import ConfigError, load_config


@pytest.mark.parametrize("bad", ["../x", "..", "a/b", "/abs", ".hidden", "a\\b", "x y"])
@pytest.mark.parametrize("key", ["data.name", "name"])
def test_names_that_would_leave_the_root_are_config_errors(tmp_path, key, bad):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"root={tmp_path}", f"{key}={bad}"])
    message = str(info.value)
    assert f"  {key}: " in message  # names the key...
    assert repr(bad) in message and "no '/', no '..'" in message  # ...the value and the fix


def test_usable_names_stay_inside_the_root(tmp_path):
    cfg = load_config(None, [f"root={tmp_path}", "name=run-1.b", "data.name=my_data.v2"])
    assert cfg.prepared_uri.endswith("/prepared/my_data.v2") and cfg.run_uri.endswith("/runs/run-1.b")
