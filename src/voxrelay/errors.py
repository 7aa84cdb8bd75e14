"""The base class of every error a user can fix (exit code 2, a message and no traceback).

Importable without torch or any heavy dependency: the CLI catches :class:`UserError` alone.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, data, checkpoint, storage location or credentials): the message says
    what is wrong, where (file/row/key/bucket) and how to fix it."""


def one_line(err: BaseException) -> str:
    """``err`` as one line: library messages (transformers, huggingface_hub, PyYAML) span several."""
    return " ".join(str(err).split())
