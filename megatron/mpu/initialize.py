"""Joining the job's process group, with a timeout and a message that says what to check (A1, A6)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Mapping

from megatron.exit_codes import TIMED_OUT
from megatron.monitoring.logger import get_logger, refresh_rank
from megatron.mpu.clocks import check_clocks
from megatron.mpu.launch_env import TORCH, LaunchEnv, discovery_mode, read_launch_env
from megatron.neox_arguments.sections.launcher import MULTI_NODE_MASTER_PORT, LauncherArgs

log = get_logger(__name__)


# nccl carries CUDA tensors only; the CPU tensors this project reduces (step metrics, checkpoint
# agreement) travel through gloo in the same process group.
NCCL_WITH_GLOO = "cpu:gloo,cuda:nccl"


def resolve_backend(requested: str) -> str:
    """The torch.distributed backend for `distributed_backend`: 'auto' and 'nccl' with CUDA are
    nccl for CUDA tensors plus gloo for CPU tensors; without CUDA, gloo ('nccl' says so loudly)."""
    import torch

    has_cuda = torch.cuda.is_available()
    if requested == "auto":
        return NCCL_WITH_GLOO if has_cuda else "gloo"
    if requested == "nccl":
        if has_cuda:
            return NCCL_WITH_GLOO
        log.warning("distributed_backend 'nccl' needs CUDA, which this machine lacks; using 'gloo'")
        return "gloo"
    return requested


def init_distributed(backend: str, timeout_minutes: float,
                     launcher: LauncherArgs | None = None) -> None:
    """Join the process group of the launcher that started this worker, or fail with a clear error.

    Rank, local rank and world size come from whatever the launcher set (DeepSpeed's RANK...,
    mpirun's OMPI_COMM_WORLD_*, PMI_*, srun's SLURM_*; see `launch_env`); `launcher` (the config's
    launcher section) selects GPT-NeoX's deepspeed_mpi / deepspeed_slurm discovery and supplies
    master_addr / master_port where the environment has none. They are then exported as RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which torch, DeepSpeed and this project
    read. Calling it again in an initialised process does nothing.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    place = resolve_launch_env(os.environ, launcher)
    os.environ.update(place.as_torch_env())
    refresh_rank()  # ranks other than 0 now log warnings only, with their rank
    if place.launcher != TORCH.launcher:
        log.info("world of %d ranks from %s's variables; master %s:%d", place.world_size,
                 place.launcher, place.master_addr, place.master_port)
    import deepspeed

    refresh_rank()  # DeepSpeed's logger exists now: its lines take the same form
    disable_deepspeed_shm_allreduce()
    backend = resolve_backend(backend)
    timeout = collective_timeout(timeout_minutes)
    try:
        with rendezvous_deadline(timeout_minutes):
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout,
                                       auto_mpi_discovery=False, verbose=False)
    except Exception as err:  # the store/rendezvous raises several types for the same cause
        raise RuntimeError(distributed_timeout_message(timeout_minutes, err)) from None
    apply_timeout_to_deepspeed_groups(timeout)
    # gloo's connect can succeed while a peer never shows up: one barrier proves the group works.
    try:
        with rendezvous_deadline(timeout_minutes):
            dist.barrier()
    except Exception as err:
        raise RuntimeError(distributed_timeout_message(timeout_minutes, err)) from None
    check_clocks()  # A5: only a warning, as nothing depends on the clocks agreeing


def collective_timeout(timeout_minutes: float) -> timedelta:
    """The timeout of every process group of the run (distributed_timeout_minutes, at least
    1 s). gloo applies it to each collective operation; nccl's watchdog aborts a collective
    that runs longer."""
    return timedelta(seconds=max(1.0, timeout_minutes * 60.0))


def apply_timeout_to_deepspeed_groups(timeout: timedelta) -> None:
    """Give the groups DeepSpeed creates itself (pipeline grid, tied layers, ZeRO) `timeout`.

    DeepSpeed's torch backend creates them with `torch.distributed.new_group(ranks)`, which
    does not inherit the default group's timeout but takes torch's default (30 minutes for
    gloo, 10 for nccl). The backend object lives as long as this process group.
    """
    import torch.distributed as dist
    from deepspeed.comm import comm as ds_comm
    from deepspeed.comm.torch import TorchBackend

    backend = ds_comm.cdb
    if not isinstance(backend, TorchBackend):
        log.warning("DeepSpeed's communication backend is %s, not its torch backend: the groups "
                    "DeepSpeed creates keep torch's default timeout", type(backend).__name__)
        return
    backend.new_group = lambda ranks: dist.new_group(ranks, timeout=timeout)


def resolve_launch_env(environ: Mapping[str, str],
                       launcher: LauncherArgs | None = None) -> LaunchEnv:
    """The launcher's variables, with master address and port from the config where unset."""
    mode = "auto" if launcher is None else discovery_mode(launcher.deepspeed_mpi,
                                                          launcher.deepspeed_slurm)
    env = read_launch_env(environ, mode)
    addr = env.master_addr or (launcher.master_addr if launcher else None)
    if addr is None:
        raise RuntimeError(
            f"MASTER_ADDR is not set and {env.launcher} does not say where rank 0 runs: set "
            "master_addr in the config (the address of the first host, reachable from every "
            "node), or export MASTER_ADDR to the workers")
    port = env.master_port or (launcher.master_port if launcher else None)
    return replace(env, master_addr=addr, master_port=port or MULTI_NODE_MASTER_PORT)


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


RENDEZVOUS_EXIT_CODE = TIMED_OUT  # the hang watchdog's code: the job ran out of time
RENDEZVOUS_GRACE_SECONDS = 30.0


def rendezvous_limit_seconds(timeout_minutes: float) -> float:
    """How long a step of joining may take before the deadline ends it: twice the timeout plus
    RENDEZVOUS_GRACE_SECONDS, so that torch's own error, where it comes, comes first (its
    store client retries a failed connect once, for the whole timeout again, after a delay
    of a few seconds; the rendezvous then waits up to the timeout for the other ranks)."""
    return 2 * timeout_minutes * 60.0 + RENDEZVOUS_GRACE_SECONDS


@contextlib.contextmanager
def rendezvous_deadline(timeout_minutes: float):
    """End this worker if the block (a step of joining the process group) outlasts
    rendezvous_limit_seconds (A1). torch's timeout does not cover every wait: a worker whose
    master port is held by a program that accepts the connection and never answers (another
    job, a launcher's daemon handed the same port) waits for ever. The worker then writes what
    it waited for and exits with RENDEZVOUS_EXIT_CODE, and its launcher stops the others."""
    limit = rendezvous_limit_seconds(timeout_minutes)
    timer = threading.Timer(limit, _rendezvous_expired, args=(timeout_minutes, limit))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _rendezvous_expired(timeout_minutes: float, waited: float) -> None:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    log.error("rank %s of world size %s got no answer joining the process group at master %s:%s "
              "in %.0f s (twice distributed_timeout_minutes %g, plus %.0f s): the program "
              "listening there is not this run's rendezvous, or the rank that hosts it failed at "
              "start-up. Check that nothing else uses master_port %s and look for another rank's "
              "error above; stopping this worker (exit %d).", rank, world, addr, port, waited,
              timeout_minutes, RENDEZVOUS_GRACE_SECONDS, port, RENDEZVOUS_EXIT_CODE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(RENDEZVOUS_EXIT_CODE)  # the joining thread is blocked and cannot unwind


def destroy_distributed() -> None:
    """Leave the process group (ZeRO-3 runs hang at exit otherwise)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
