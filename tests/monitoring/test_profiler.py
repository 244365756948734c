"""profile / memory_profiling around real DeepSpeed training steps on two gloo ranks: each rank
writes a Chrome trace of just the profiled steps with their phases labelled, and a memory
timeline with one entry per profiled step; a run that stops inside the window still writes them,
and on CUDA the trace has kernels and the allocator snapshot is dumped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed import run_distributed

PHASES = {"Get batch", "Forward pass", "Backward pass", "Optimizer step"}


def profile_four_steps(rank: int, world: int, run_dir: str) -> dict:
    """Train iterations 1..4 with profile_step_start 1 and profile_step_stop 3, without and with
    a pipeline engine (pipe_parallel_size 0 and 1)."""
    import torch.distributed as dist

    from megatron.monitoring.profiler import StepProfiler
    from megatron.training.step import train_step
    from tests.checkpointing.engines import batches, build, make_args

    written = {}
    for pipe in (0, 1):
        run = Path(run_dir) / f"pipe{pipe}"
        args = make_args(run, pipe_parallel_size=pipe, profile=True, memory_profiling=True,
                         profile_step_start=1, profile_step_stop=3,
                         tensorboard_dir=str(run / "tb"), memory_profiling_path=str(run / "memory"))
        engine = build(args)
        profiler = StepProfiler.from_args(args, engine, resumed_at=0)
        data = batches(0, args, engine.topology.coords(dist.get_rank()).data)
        for iteration in range(1, 5):
            with profiler.step(iteration):
                train_step(engine, data)
            if iteration == 3:  # the trace is written when the window's last step ends
                written[pipe] = {"trace": str(profiler.trace_path),
                                 "timeline": str(profiler.memory.timeline_path)}
        profiler.close()
    return written


def trace_events(path) -> list[dict]:
    return json.loads(Path(path).read_text())["traceEvents"]


def test_each_rank_traces_the_profiled_steps_with_their_phases(tmp_path):
    results = run_distributed(profile_four_steps, 2, str(tmp_path))
    for pipe in (0, 1):
        run = tmp_path / f"pipe{pipe}"
        for rank, result in enumerate(r[pipe] for r in results):
            trace = Path(result["trace"])
            assert trace.parent == run / "tb" and trace.name.startswith(f"rank{rank}.")
            assert trace.name.endswith(".pt.trace.json")
            names = {e.get("name") for e in trace_events(trace)}
            assert PHASES <= names, f"phase labels missing from {trace}: {PHASES - names}"
            steps = sorted(n for n in names if n and n.startswith("ProfilerStep#"))
            assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # the iterations profiled
            timeline = json.loads(Path(result["timeline"]).read_text())
            assert Path(result["timeline"]).name == f"memory_timeline_rank{rank}.json"
            assert (timeline["rank"], timeline["device"]) == (rank, "cpu")
            assert [s["iteration"] for s in timeline["steps"]] == [2, 3]
            for step in timeline["steps"]:
                assert 0 < step["rss_bytes"] <= step["peak_rss_bytes"]
        # one trace per rank, and nothing written again after the window
        assert sorted(p.name.split(".")[0] for p in (run / "tb").iterdir()) == ["rank0", "rank1"]


def test_profiled_iterations_follow_gpt_neox_window_and_a_resume():
    from megatron.monitoring.profiler import profiled_iterations

    assert list(profiled_iterations(10, 12)) == [11, 12]  # GPT-NeoX's defaults
    assert list(profiled_iterations(10, 12, resumed_at=11)) == [12]
    assert list(profiled_iterations(10, 12, resumed_at=12)) == []


def test_a_run_that_stops_inside_the_window_writes_what_it_recorded(tmp_path, capsys):
    import torch

    from megatron.monitoring.memory_profile import MemoryRecorder
    from megatron.monitoring.profiler import FORWARD, StepProfiler

    memory = MemoryRecorder(tmp_path / "m", rank=0, cuda=False)
    profiler = StepProfiler(range(2, 6), str(tmp_path / "tb"), memory)
    for iteration in (1, 2, 3):  # the run ends at iteration 3 (exit_interval, an error)
        with profiler.step(iteration), torch.profiler.record_function(FORWARD):
            torch.ones(64, 64) @ torch.ones(64, 64)
    assert profiler.trace_path is None  # nothing is written before the run ends
    profiler.close()
    names = {e.get("name") for e in trace_events(profiler.trace_path)}
    assert {"ProfilerStep#2", "ProfilerStep#3", FORWARD} <= names
    assert not {"ProfilerStep#1", "ProfilerStep#4"} & names
    timeline = json.loads((tmp_path / "m" / "memory_timeline_rank0.json").read_text())
    assert [s["iteration"] for s in timeline["steps"]] == [2, 3]
    out = capsys.readouterr().out
    assert ("profiler trace of iterations 2 to 3 (the run stopped before 5): "
            f"{profiler.trace_path}") in out
    assert "memory profile of iterations 2 to 3 (the run stopped before 5)" in out


@pytest.mark.gpu
def test_on_cuda_the_trace_has_kernels_and_the_allocator_snapshot_is_dumped(tmp_path):
    import pickle

    import torch

    from megatron.monitoring.memory_profile import MemoryRecorder
    from megatron.monitoring.profiler import StepProfiler

    memory = MemoryRecorder(tmp_path / "m", rank=0, cuda=True)
    profiler = StepProfiler(range(1, 3), str(tmp_path / "tb"), memory, cuda=True)
    for iteration in (1, 2):
        with profiler.step(iteration):
            x = torch.ones(1024, 1024, device="cuda")
            (x @ x).sum().item()
    events = trace_events(profiler.trace_path)
    assert any(e.get("cat") == "kernel" for e in events), "no CUDA kernel in the trace"
    snapshot = pickle.loads((tmp_path / "m" / "mem_snapshot_rank0.pickle").read_bytes())
    assert snapshot["segments"] and snapshot["device_traces"][0]  # allocations were recorded
    steps = json.loads(memory.timeline_path.read_text())["steps"]
    assert [s["iteration"] for s in steps] == [1, 2]
    assert all(s["cuda_step_peak_bytes"] >= 2 * 1024 * 1024 * 4 for s in steps)


def test_a_program_started_from_a_large_one_reports_its_own_peak_memory():
    """Linux carries getrusage's ru_maxrss over an exec from the forking process; the peak this
    framework reports (VmHWM) is the started program's own."""
    import subprocess
    import sys

    import torch

    held = torch.ones(1024, 1024, 256)  # 1 GiB resident in this process while the child starts
    probe = ("import resource; from megatron.monitoring.memory_profile import peak_rss_bytes; "
             "print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2]).stdout
    own, inherited = (int(v) for v in out.split())
    assert held.sum().item() == 2**28
    assert own < 2**30 <= inherited  # torch's import alone is far below 1 GiB
