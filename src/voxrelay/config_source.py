"""Where a config's YAML comes from: a local file, or an object in storage (gs://, s3://, file://, memory://).

A config in the bucket is what a Colab notebook or a spot job trains from: every session, on any machine, reads
the same file, and nothing has to be copied onto a machine that will be gone tomorrow.
"""

from __future__ import annotations

from pathlib import Path

_UPLOAD = {"gs": "gcloud storage cp my.yaml {uri}", "s3": "aws s3 cp my.yaml {uri}"}


def read_config_text(source: str) -> str:
    """The text of the config at ``source``: a local path, or a storage URI (it contains ``://``).
    Raises ConfigError naming the source and the fix when there is no such file or object (a denied access is
    storage's StorageDenied, which names the bucket and the credentials to check)."""
    from voxrelay.config import ConfigError  # (voxrelay.config imports this module)

    if "://" not in source:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist; pass the path of a YAML file")
        return path.read_text()
    from voxrelay import storage

    try:
        return storage.read_text(source)
    except FileNotFoundError:
        upload = _UPLOAD.get(source.split("://", 1)[0], "").format(uri=source)
        how = f"upload it first (`{upload}`)" if upload else "write it first"
        raise ConfigError(f"config {source!r} does not exist; {how}, or fix the URI (a gs://, s3:// or file:// "
                          "URI of a YAML object, or a local path)") from None
