"""TEST-ONLY fault injection for checkpoint saves, driven by one environment variable.

    MEGATRON_CHECKPOINT_FAULT="<kind>:rank=<r>[:iteration=<n>][,<kind>:...]"

kinds:
    kill     the rank SIGKILLs itself after its files of the save are written and fsynced, before
             the barrier that precedes the commit (a worker dying in the middle of a save)
    enospc   the first file the rank writes in the save gets half its bytes, then the write
             raises OSError(ENOSPC) (the disk filling up in the middle of a save)

Only the failure is simulated; everything around it (other ranks, the commit protocol, the
launcher) runs for real. Tests in tests/checkpointing set it on `deepy` runs; it is never set
in normal use, and an unparsable value is an error rather than being ignored.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

ENV = "MEGATRON_CHECKPOINT_FAULT"
KINDS = ("kill", "enospc")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    iteration: int | None


def parse(value: str) -> list[Fault]:
    """The faults a MEGATRON_CHECKPOINT_FAULT value asks for."""
    faults = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        kind, *fields = item.split(":")
        options = dict(f.split("=", 1) for f in fields if "=" in f)
        if kind not in KINDS or "rank" not in options or set(options) - {"rank", "iteration"}:
            raise ValueError(f"{ENV}={value!r}: cannot parse {item!r}; expected "
                             f"<kind>:rank=<r>[:iteration=<n>] with kind one of {', '.join(KINDS)}")
        iteration = int(options["iteration"]) if "iteration" in options else None
        faults.append(Fault(kind, int(options["rank"]), iteration))
    return faults


def planned(kind: str, rank: int, iteration: int) -> bool:
    """Whether the environment asks for fault `kind` on `rank` in the save of `iteration`."""
    value = os.environ.get(ENV)
    if not value:
        return False
    return any(f.kind == kind and f.rank == rank and f.iteration in (None, iteration)
               for f in parse(value))


def kill_if_planned(rank: int, iteration: int) -> None:
    if planned("kill", rank, iteration):
        os.kill(os.getpid(), signal.SIGKILL)


def enospc_if_planned(rank: int, iteration: int, path: Path, size_hint: int = 1 << 16) -> None:
    """Leave a partial `path` and raise ENOSPC, as a full disk would mid-write."""
    if planned("enospc", rank, iteration):
        with open(path, "wb") as f:
            f.write(b"\0" * (size_hint // 2))
        raise OSError(errno.ENOSPC, f"No space left on device (injected by {ENV})", str(path))
