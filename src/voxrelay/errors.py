"""The base class of every error a user can fix (exit code 2, a message and no traceback).

Importable without torch or any heavy dependency: the CLI catches :class:`UserError` alone.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, data, checkpoint, storage location or credentials): the message says
    what is wrong, where (file/row/key/bucket) and how to fix it."""


class ConfigError(UserError, ValueError):
    """A configuration problem; the message names the key, the bad value and the fix (also
    importable as ``voxrelay.config.ConfigError``)."""


def one_line(err: BaseException) -> str:
    """``err`` as one line: library messages (transformers, huggingface_hub, PyYAML) span several."""
    return " ".join(str(err).split())
