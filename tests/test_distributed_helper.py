"""The helper that runs a test function on N gloo processes (tests/distributed.py): its
processes come from a fork server that has imported torch and DeepSpeed, yet behave as freshly
started ones would for what the tests rely on."""

from __future__ import annotations

import multiprocessing
import os

from tests.distributed import run_distributed


def _report(rank, world, marker):
    import torch.distributed as dist

    if marker:
        print(f"{marker} from rank {rank} of {dist.get_world_size()}", flush=True)
    return {"env": os.environ.get("NEOX_HELPER_PROBE"), "server": os.getppid(),
            "rank": os.environ["RANK"],
            "start_method": multiprocessing.get_start_method(allow_none=True)}


def test_output_reaches_the_capture_of_the_test_that_runs_it(capfd):
    with capfd.disabled():  # the fork server may start here, with the terminal as its stdout
        run_distributed(_report, 1, None)
    run_distributed(_report, 2, "inside")
    out = capfd.readouterr().out
    assert "inside from rank 0 of 2" in out and "inside from rank 1 of 2" in out, out


def test_the_environment_is_the_tests_own_at_the_time_of_the_run(monkeypatch):
    run_distributed(_report, 1, "before")  # the server's environment is fixed when it starts
    monkeypatch.setenv("NEOX_HELPER_PROBE", "set by the test")
    results = run_distributed(_report, 2, "after")
    assert [r["env"] for r in results] == ["set by the test"] * 2
    assert [r["rank"] for r in results] == ["0", "1"]


def test_runs_fork_from_one_server_on_cpu():
    first = run_distributed(_report, 1, "first")[0]
    second = run_distributed(_report, 1, "second")[0]
    assert first["server"] == second["server"] != os.getpid()
    # what a process starts (a DataLoader's workers) forks from it, as from a launched worker,
    # rather than coming slowly through the fork server
    assert first["start_method"] == second["start_method"] == "fork"


def test_with_a_gpu_accelerator_processes_are_spawned_and_print_to_the_capture(monkeypatch,
                                                                               capfd):
    """The GPU tier spawns (DeepSpeed's import in a fork server would touch CUDA); its
    processes get the same descriptors under the same numbers, which must stay open."""
    import tests.distributed as helper

    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    spawn = helper._context()
    assert spawn.get_start_method() == "spawn"
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # this machine's processes must not try CUDA
    monkeypatch.setattr(helper, "_context", lambda: spawn)
    monkeypatch.setenv("NEOX_HELPER_PROBE", "spawned")
    results = run_distributed(_report, 2, "spawned")
    assert [r["env"] for r in results] == ["spawned"] * 2
    assert {r["server"] for r in results} == {os.getpid()}
    out = capfd.readouterr().out
    assert "spawned from rank 0 of 2" in out and "spawned from rank 1 of 2" in out, out
