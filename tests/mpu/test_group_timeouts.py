"""Every process group of a run has the configured timeout (distributed_timeout_minutes), not
only the world group: the project's tensor/data/pipeline groups and the groups DeepSpeed creates
itself. torch's new_group would otherwise give them its default of 30 minutes (gloo)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from megatron.mpu.groups import ProcessGroups
from megatron.mpu.initialize import collective_timeout, init_distributed
from megatron.mpu.topology import Topology
from tests.distributed import run_distributed

MINUTES = 0.05  # 3 s


def _timeout(group) -> timedelta:
    return group._get_backend(torch.device("cpu")).options._timeout


def _group_timeouts(rank, world, done_file):
    import torch.distributed as dist
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology, PipelineParallelGrid

    init_distributed("gloo", MINUTES)
    ours = ProcessGroups.build(Topology(tp=1, pp=1, dp=2), collective_timeout(MINUTES))
    grid = PipelineParallelGrid(topology=PipeDataParallelTopology(num_pp=1, num_dp=2))
    timeouts = {"world": _timeout(dist.group.WORLD), "tp": _timeout(ours.tp_group),
                "dp": _timeout(ours.dp_group), "pp": _timeout(ours.pp_group),
                "deepspeed dp": _timeout(grid.get_data_parallel_group()),
                "deepspeed slice": _timeout(grid.get_slice_parallel_group())}
    # what a user sees: rank 1 never joins the all-reduce on DeepSpeed's group; rank 0 fails
    # after the configured timeout instead of waiting 30 minutes
    outcome = None
    if timeouts["deepspeed dp"] != timedelta(seconds=3):
        return timeouts, outcome  # the all-reduce below would wait for torch's default
    if rank == 0:
        try:
            dist.all_reduce(torch.ones(1), group=grid.get_data_parallel_group())
            outcome = "completed"
        except RuntimeError as err:
            outcome = str(err)
        done_file.write_text("done")
    else:
        while not done_file.exists():
            time.sleep(0.1)
    return timeouts, outcome


def test_every_group_gets_the_configured_timeout(tmp_path):
    results = run_distributed(_group_timeouts, 2, tmp_path / "done", join=False)
    for timeouts, _ in results:
        assert timeouts == dict.fromkeys(timeouts, timedelta(seconds=3)), timeouts
    assert "Timed out waiting 3000ms" in results[0][1]


def _join_asking_for_nccl(rank, world):
    import logging

    from tests.logs import Warnings

    handler = Warnings()
    logging.getLogger("megatron.mpu.initialize").addHandler(handler)
    init_distributed("nccl", 0.5)
    dist.all_reduce(torch.ones(1))  # the group works
    return dist.get_backend(), handler.messages


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback on a CPU-only machine")
def test_nccl_without_cuda_falls_back_to_gloo_and_says_so():
    """A6: distributed_backend nccl on a machine without CUDA joins over gloo with a warning."""
    for backend, warnings in run_distributed(_join_asking_for_nccl, 2, join=False):
        assert backend == "gloo"
        assert "distributed_backend 'nccl' needs CUDA, which this machine lacks; using 'gloo'" \
            in warnings


def test_a_master_port_that_never_answers_ends_the_worker_saying_what_it_waited_for():
    """torch's timeout does not end a join whose master port is held by a program that accepts
    the connection and never answers (it waited until killed); the rendezvous deadline ends
    the worker after the timeout plus as much again, with exit 124 and one error line."""
    import socket
    import subprocess
    import sys
    import threading

    from tests.runs import ROOT, clean_env

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    held = []
    threading.Thread(target=lambda: held.extend(listener.accept() for _ in range(4)),
                     daemon=True).start()
    code = "from megatron.mpu.initialize import init_distributed; init_distributed('gloo', 0.02)"
    env = clean_env(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    took = time.monotonic() - start
    listener.close()
    assert held, "the worker never connected to the port"
    assert proc.returncode == 124, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if "got no answer" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert (f"rank 1 of world size 2 got no answer joining the process group at master "
            f"127.0.0.1:{port} in 32 s (twice distributed_timeout_minutes 0.02, plus 30 s): the "
            "program listening there is not this run's rendezvous") in errors[0], errors[0]
    assert f"nothing else uses master_port {port}" in errors[0]
    assert took < 90, took
