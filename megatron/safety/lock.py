"""One run per save directory: a lock file naming its holder, taken for the run's life.

    with save_dir_lock(args.checkpoint.save, enabled=rank == 0):
        ...train...

    <save>/.run.lock    {"host": ..., "pid": ..., "started": <unix time>,
                         "process_start": <the holder's start time>, "command": ...}

The lock is created with O_EXCL, so of two runs started at once exactly one gets it; the other
is refused with the holder named. A lock whose holder is gone (same host, and no process with
that PID and start time) is stale: taken over with a warning. A lock held from another host
cannot be checked from here: the run is refused, saying how to remove it if that run is dead.
`deepy.py` checks the lock before any worker starts (`check_free`); rank 0 of the training
run takes it (the check that counts, since both runs may pass deepy's).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from pathlib import Path

import psutil

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

LOCK_NAME = ".run.lock"


class SaveDirInUse(RuntimeError):
    """Another live run holds the save directory."""


def _process_start(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _me() -> dict:
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": time.time(),
            "process_start": _process_start(pid), "command": " ".join(sys.argv)[:300]}


def read_holder(save_dir: str | Path) -> dict | None:
    """The lock's content, or None when there is no lock ({} when it cannot be read)."""
    path = Path(save_dir) / LOCK_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def is_alive(holder: dict) -> bool | None:
    """Whether the lock's holder still runs: None when that cannot be told from this host."""
    if holder.get("host") != socket.gethostname():
        return None
    started = _process_start(int(holder.get("pid", -1)))
    if started is None:
        return False
    recorded = holder.get("process_start")
    return recorded is None or abs(started - recorded) < 1.0  # a reused PID is another process


def describe(holder: dict, save_dir: str | Path) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (f"pid {holder.get('pid')} on host {holder.get('host')} since {since} "
            f"({holder.get('command', 'unknown command')}; lock file "
            f"{Path(save_dir) / LOCK_NAME})")


def check_free(save_dir: str | Path | None) -> None:
    """SaveDirInUse when a live run (or one on another host) holds `save_dir`."""
    if not save_dir:
        return
    holder = read_holder(save_dir)
    if holder is None:
        return
    alive = is_alive(holder)
    if alive is False:
        return
    where = "" if alive else (": it was taken on another host, so this host cannot tell whether "
                              "that run is alive; if it is not, delete the lock file")
    raise SaveDirInUse(f"save directory {save_dir} is in use by another run: "
                       f"{describe(holder, save_dir)}{where}. Wait for that run to finish, or "
                       "set `save` to another directory")


def acquire(save_dir: str | Path) -> Path:
    """Take the lock (taking over a stale one, with a warning); SaveDirInUse otherwise."""
    root = Path(save_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_NAME
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_free(root)  # raises for a live holder
            holder = read_holder(root)
            if holder is not None:
                log.warning("taking over the lock of %s: its holder is gone (%s)", root,
                            describe(holder, root))
                path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(_me(), f)
        return path
    raise SaveDirInUse(f"could not take the lock {path}: another run keeps taking it")


def release(path: Path) -> None:
    """Remove the lock if it is still ours."""
    holder = read_holder(path.parent)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def save_dir_lock(save_dir: str | Path | None, enabled: bool = True):
    """Hold the lock of `save_dir` for the block (nothing when disabled or no save dir)."""
    if not (enabled and save_dir):
        yield None
        return
    path = acquire(save_dir)
    try:
        yield path
    finally:
        release(path)


@contextlib.contextmanager
def run_lock(save_dir: str | Path | None):
    """save_dir_lock for a distributed run: rank 0 takes it and every rank learns whether it
    did, so all of them stop together when another run holds the directory. Collective."""
    import torch.distributed as dist

    path, problem = None, None
    if dist.get_rank() == 0 and save_dir:
        try:
            path = acquire(save_dir)
        except SaveDirInUse as err:
            problem = str(err)
    box = [problem]
    dist.broadcast_object_list(box, src=0)
    if box[0]:
        raise SaveDirInUse(box[0])
    try:
        yield path
    finally:
        if path is not None:
            release(path)
