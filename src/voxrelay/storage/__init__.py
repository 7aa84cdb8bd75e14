"""Storage over fsspec: local paths, file://, gs://, s3:// and memory:// with plain-string URIs.

This package is the only code that imports fsspec, gcsfs or s3fs. Writes are atomic per object:
local files are written to a temporary name and renamed; object stores commit a single PUT.
Multi-file artefacts (prepared shards, checkpoints) are committed by a marker file written last.

Endpoints and credentials come from the usual places: AWS_* variables / ~/.aws for s3
(``AWS_ENDPOINT_URL`` for S3-compatible servers), Application Default Credentials for gs
(``STORAGE_EMULATOR_HOST`` for a test server).
"""

from voxrelay.storage.conditional import PreconditionFailed, Versioned, create_new, read_versioned, replace_if
from voxrelay.storage.core import (
    StorageDenied,
    StorageError,
    StorageUnavailable,
    check_root,
    delete,
    denied,
    exists,
    file_mode,
    file_sizes,
    fsync_file,
    get_file,
    is_local,
    is_transient,
    join,
    listdir,
    local_path,
    match_umask,
    open_read,
    put_file,
    read_bytes,
    read_json,
    read_text,
    retry,
    size,
    transient_errors,
    tree_sizes,
    write_bytes,
    write_json,
    write_text,
)
from voxrelay.storage.counters import op_counts
from voxrelay.storage.names import (
    OutsideRoot,
    UnsafeName,
    basename,
    check_name,
    checked_join,
    inside,
    is_plain_name,
    is_uri,
    parent,
)

__all__ = [
    "OutsideRoot",
    "PreconditionFailed",
    "StorageDenied",
    "StorageError",
    "StorageUnavailable",
    "UnsafeName",
    "basename",
    "check_name",
    "check_root",
    "checked_join",
    "create_new",
    "delete",
    "denied",
    "exists",
    "file_mode",
    "file_sizes",
    "fsync_file",
    "get_file",
    "inside",
    "is_local",
    "is_plain_name",
    "is_transient",
    "is_uri",
    "join",
    "listdir",
    "local_path",
    "match_umask",
    "op_counts",
    "open_read",
    "parent",
    "put_file",
    "read_bytes",
    "tree_sizes",
    "read_json",
    "read_text",
    "read_versioned",
    "replace_if",
    "retry",
    "size",
    "transient_errors",
    "Versioned",
    "write_bytes",
    "write_json",
    "write_text",
]
