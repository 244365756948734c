"""Directories a run or a tool writes into, checked before the work starts (no torch):

    check_writable("save", "/data/ck/run1")   # PermissionError / ValueError naming the key
    make_output_dir("data/mine", "--output-prefix")

Both name the config key or option the path came from, so that a bad path is one line saying
which setting to change, not a bare OSError from deep inside a worker or a conversion.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

WRITE_ADVICE = "choose a directory this user can write to"


def _file_in_the_way(key: str, path: Path, existing: Path) -> ValueError:
    """The error for a path whose nearest existing part, `existing`, is a file."""
    where = f"{path} is" if existing == path else f"{path} cannot be made: {existing} is"
    return ValueError(f"{key}: {where} a file, not a directory; choose another path")


def check_writable(key: str, directory: str | Path) -> None:
    """`directory` (from config key or option `key`) is a directory this process can write in,
    or can be created: a directory made and removed at once in its nearest existing ancestor
    proves it (permission bits do not, for root or on a read-only file system)."""
    path = Path(directory)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise _file_in_the_way(key, path, existing)
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".write-check-", dir=existing))
    except OSError as err:
        where = (f"cannot write in {path}" if existing == path else
                 f"cannot create {path}: {existing} is not writable")
        raise PermissionError(f"{key}: {where} ({err.strerror}); {WRITE_ADVICE}") from None


def make_output_dir(path: str | Path, what: str) -> None:
    """Create the directory `path` (with its parents) for outputs the option `what` names; a
    failure is one message naming both."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise _file_in_the_way(what, Path(path), Path(path))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise PermissionError(f"{what}: cannot create the directory {path} ({err.strerror}); "
                              f"{WRITE_ADVICE}") from None
