"""The few collectives checkpointing uses, over the default group; plain values without one.

Every decision that could differ between ranks (a failed write, a corrupt file, which checkpoint
to load) goes through `all_gather` or `broadcast` so that all ranks act on the same answer.
"""

from __future__ import annotations

from typing import Any


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist else 0


def world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist else 1


def barrier() -> None:
    dist = _dist()
    if dist:
        dist.barrier()


def all_gather(obj: Any) -> list:
    """Every rank's `obj` (picklable), indexed by rank, on every rank."""
    dist = _dist()
    if not dist:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    dist = _dist()
    if not dist:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
