"""Run a function on N real gloo processes (torch.multiprocessing) and collect what each returns."""

from __future__ import annotations

import os
import socket
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn, args, results, join: bool = True):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch

    torch.set_num_threads(1)
    if join:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = ("ok", fn(rank, world, *args))
    except Exception:  # reported to the parent, which fails the test with it
        results[rank] = ("error", traceback.format_exc())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world: int, *args, join: bool = True):
    """fn(rank, world, *args) on `world` gloo processes; returns the list of results by rank.

    `fn` must be a module-level function; results must be picklable (tensors are fine). With
    `join` False the processes start outside any process group (RANK, MASTER_ADDR ... set) and
    `fn` joins one itself.
    """
    ctx = mp.get_context("spawn")
    port = _port()
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, results, join))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        out = dict(results)
    errors = [f"rank {r}:\n{v[1]}" for r, v in sorted(out.items()) if v[0] == "error"]
    missing = [r for r in range(world) if r not in out]
    if errors or missing:
        raise AssertionError("distributed run failed\n" + "\n".join(errors) +
                             (f"\nranks without a result: {missing}" if missing else ""))
    return [out[r][1] for r in range(world)]

