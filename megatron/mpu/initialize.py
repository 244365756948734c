"""Joining the job's process group, with a timeout and a message that says what to check (A1, A6)."""

from __future__ import annotations

import os
from datetime import timedelta

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def resolve_backend(requested: str) -> str:
    """'auto' is nccl with CUDA and gloo without; nccl without CUDA falls back to gloo, loudly."""
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return "nccl" if has_cuda else "gloo"
    if requested == "nccl" and not has_cuda:
        log.warning("distributed_backend 'nccl' needs CUDA, which this machine lacks; using 'gloo'")
        return "gloo"
    return requested


def init_distributed(backend: str, timeout_minutes: float) -> None:
    """Join the process group described by the launcher's environment, or fail with a clear error.

    The environment must carry RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the
    DeepSpeed launcher sets them). Calling it again in an initialised process does nothing.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    missing = [v for v in _LAUNCH_VARS if v not in os.environ]
    if missing:
        raise RuntimeError(
            f"environment variables {', '.join(missing)} are not set: start workers through "
            "`python deepy.py <script> <configs>` (or set RANK, LOCAL_RANK, WORLD_SIZE, "
            "MASTER_ADDR and MASTER_PORT by hand for a single process)")
    import deepspeed

    disable_deepspeed_shm_allreduce()
    backend = resolve_backend(backend)
    timeout = timedelta(seconds=max(1.0, timeout_minutes * 60.0))
    try:
        deepspeed.init_distributed(dist_backend=backend, timeout=timeout, auto_mpi_discovery=False,
                                   verbose=False)
    except Exception as err:  # the store/rendezvous raises several types for the same cause
        raise RuntimeError(distributed_timeout_message(timeout_minutes, err)) from None
    # gloo's connect can succeed while a peer never shows up: one barrier proves the group works.
    try:
        dist.barrier()
    except Exception as err:
        raise RuntimeError(distributed_timeout_message(timeout_minutes, err)) from None


def disable_deepspeed_shm_allreduce() -> None:
    """Keep DeepSpeed from building and starting its CPU shared-memory all-reduce.

    It serves only DeepSpeed's inference_all_reduce, which this project never calls; enabled,
    it JIT-builds an op at first start and leaves a 69 MB /dev/shm buffer per rank behind after
    every run, which fills memory over many runs. Call before DeepSpeed creates its backend
    (deepspeed.init_distributed, or deepspeed.initialize on an initialised process group).
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def distributed_timeout_message(timeout_minutes: float, err: Exception) -> str:
    """A1: name the master address, this rank and the world size, and what to check."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"rank {rank} of world size {world} could not join the process group at master "
            f"{addr}:{port} within {timeout_minutes * 60:.0f} s ({first_line}). Check that every "
            "node can reach that address and port (firewall, MASTER_ADDR/master_addr, "
            "master_port not in use) and that all ranks were started; raise "
            "distributed_timeout_minutes if nodes start slowly.")


def destroy_distributed() -> None:
    """Leave the process group (ZeRO-3 runs hang at exit otherwise)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
