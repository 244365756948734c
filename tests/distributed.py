"""Run a function on N real gloo processes (torch.multiprocessing) and collect what each returns.

The processes come from one fork server per test session that has imported torch and
DeepSpeed once: on a small CPU box that import costs seconds per process, which a spawned
process would pay again each time. Each process still starts clean of any process group, with
the test's environment as it is when the run starts.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# imported once by the fork server; nothing here starts a thread or touches a device.
# torch._dynamo (~2 s) is imported by the first torch optimizer a process builds
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "deepspeed"]


def _context():
    """The fork server on CPU. With a GPU accelerator, spawn: DeepSpeed's import would touch
    CUDA in the server, and a forked process cannot use CUDA after its parent did."""
    if os.environ.get("DS_ACCELERATOR", "cpu") != "cpu":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # takes effect when the server starts, on first use
    return ctx


def _received_stdio(stdout, stderr) -> tuple[int, int]:
    return stdout.detach(), stderr.detach()


class _Stdio:
    """The test process's stdout and stderr as they are now (capfd may have redirected them),
    handed to a new process: the fork server's own are those of the test that started it."""

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _received_stdio, (DupFd(1), DupFd(2))  # sent along with the process


def _worker(rank: int, world: int, port: int | None, fn, args, results, join: bool = True,
            environ: dict | None = None, stdio=None):
    if stdio is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target in zip(stdio, (1, 2)):
            if fd != target:  # spawn hands the same descriptors over under their own numbers
                os.dup2(fd, target)
                os.close(fd)
    if environ is not None:  # the fork server's environment is the one it started with
        os.environ.clear()
        os.environ.update(environ)
    if port is not None:  # otherwise the environment given names the rendezvous
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if multiprocessing.get_start_method(allow_none=True) == "forkserver":
        # what this process starts (a DataLoader's workers) forks from it, as from a worker
        # deepy.py starts: through the fork server, a tiny 4-iteration training waited 16 s
        # on its data loader's workers
        multiprocessing.set_start_method("fork", force=True)
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


def run_distributed(fn, world: int, *args, join: bool = True,
                    environs: list[dict] | None = None):
    """fn(rank, world, *args) on `world` gloo processes; returns the list of results by rank.

    `fn` must be a module-level function; results must be picklable (tensors are fine). With
    `join` False the processes start outside any process group (RANK, MASTER_ADDR ... set) and
    `fn` joins one itself. `environs`, one per rank, replaces the test's environment and the
    variables set here: each names its rank and rendezvous itself, as a launcher's would.
    """
    ctx = _context()
    port = None if environs else _port()
    environs = environs or [dict(os.environ)] * world
    assert len(environs) == world, f"{len(environs)} environments for {world} processes"
    with ctx.Manager() as manager:
        results = manager.dict()
        procs = [ctx.Process(target=_worker,
                             args=(r, world, port, fn, args, results, join, environs[r],
                                   _Stdio()))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        for p in procs:  # a process still running is stuck: nothing may outlive the test
            if p.is_alive():
                p.kill()
                p.join()
        out = dict(results)
    errors = [f"rank {r}:\n{v[1]}" for r, v in sorted(out.items()) if v[0] == "error"]
    missing = [r for r in range(world) if r not in out]
    if errors or missing:
        raise AssertionError("distributed run failed\n" + "\n".join(errors) +
                             (f"\nranks without a result: {missing}" if missing else ""))
    return [out[r][1] for r in range(world)]

