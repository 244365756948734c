"""Profiling a window of training steps on every rank: a torch.profiler trace and a memory record.

The window is the steps that take the run from iteration `profile_step_start` to
`profile_step_stop`, the steps GPT-NeoX's torch.profiler schedule records (its defaults, 10 and
12, profile iterations 11 and 12). A resumed run profiles what is left of the window.

`profile: true`: torch.profiler records the window on every rank (CPU activity, and CUDA kernels
when the model is on a GPU) with shapes, memory, FLOPs, modules and Python stacks, as GPT-NeoX
records them, and writes one Chrome trace per rank, named as
`torch.profiler.tensorboard_trace_handler` names them: `rank<N>.<time ns>.pt.trace.json` in
`tensorboard_dir` (else `log_dir`). TensorBoard's profiler plugin (torch-tb-profiler) reads that
directory; Perfetto (ui.perfetto.dev) and chrome://tracing open the file. Each step is a
`ProfilerStep#<k>` span, and its phases carry the names of GPT-NeoX's NVTX ranges ("Get batch",
"Forward pass", "Backward pass", "Optimizer step"): `megatron/training/step.py` labels them, and
`label_pipeline_phases` labels the pipeline engine's instructions. On CUDA the window is also
bracketed by cudaProfilerStart/Stop, so `nsys profile --capture-range=cudaProfilerApi` captures
the same steps, as in GPT-NeoX.

`memory_profiling: true` records memory over the same window
(megatron/monitoring/memory_profile.py).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist
from torch.profiler import ProfilerAction, ProfilerActivity, record_function

from megatron.monitoring.logger import get_logger, print_rank_0
from megatron.monitoring.memory_profile import MemoryRecorder

log = get_logger(__name__)

# phase labels, as GPT-NeoX names its NVTX ranges
GET_BATCH, FORWARD, BACKWARD, OPTIMIZER_STEP = (
    "Get batch", "Forward pass", "Backward pass", "Optimizer step")


def profiled_iterations(start: int, stop: int, resumed_at: int = 0) -> range:
    """The iterations whose steps are profiled, for a run that starts after `resumed_at`."""
    return range(max(start, resumed_at) + 1, stop + 1)


class StepProfiler:
    """Wraps each training step: starts profiling at the window's first, stops after its last."""

    def __init__(self, window: range, trace_dir: str | None, memory: MemoryRecorder | None,
                 rank: int = 0, cuda: bool = False):
        self.window = window
        self.trace_dir = trace_dir
        self.memory = memory
        self.rank = rank
        self.cuda = cuda
        self.trace_path: Path | None = None
        self._torch: torch.profiler.profile | None = None
        self._done: list[int] = []
        self._active = False

    @classmethod
    def from_args(cls, args, engine, resumed_at: int) -> StepProfiler:
        """The profiler the logging section asks for (one that does nothing when none is)."""
        lg = args.logging
        if not (lg.profile or lg.memory_profiling):
            return cls(range(0), None, None)
        rank = dist.get_rank()
        cuda = next(engine.engine.module.parameters()).device.type == "cuda"
        window = profiled_iterations(lg.profile_step_start, lg.profile_step_stop, resumed_at)
        if not window and rank == 0:
            log.warning("profiling: the run starts at iteration %d, after the profiled steps "
                        "(profile_step_start %d to profile_step_stop %d); nothing is profiled",
                        resumed_at, lg.profile_step_start, lg.profile_step_stop)
        memory = (MemoryRecorder(lg.memory_profiling_path, rank, cuda) if lg.memory_profiling
                  else None)
        if lg.profile and engine.is_pipeline:
            label_pipeline_phases(engine.engine)
        return cls(window, (lg.tensorboard_dir or lg.log_dir) if lg.profile else None, memory,
                   rank, cuda)

    @contextmanager
    def step(self, iteration: int) -> Iterator[None]:
        """Wrap the training step that completes `iteration`."""
        if iteration not in self.window:
            yield
            return
        if not self._active:
            self._start(iteration)
        elif self._torch is not None:
            self._torch.step()
        if self.memory is not None:
            self.memory.before_step()
        yield
        self._done.append(iteration)
        if self.memory is not None:
            self.memory.after_step(iteration)
        if iteration == self.window[-1]:
            self._finish()

    def close(self) -> None:
        """Write what was recorded when the run ends inside the window (exit_interval, error)."""
        if self._active:
            self._finish()

    def _start(self, iteration: int) -> None:
        self._active = True
        if self.cuda:
            torch.cuda.profiler.start()
        if self.memory is not None:
            self.memory.start()
        if self.trace_dir is not None:
            activities = ([ProfilerActivity.CPU, ProfilerActivity.CUDA] if self.cuda
                          else [ProfilerActivity.CPU])
            self._torch = torch.profiler.profile(
                activities=activities, schedule=_record_every_step,
                on_trace_ready=self._write_trace, record_shapes=True, profile_memory=True,
                with_flops=True, with_modules=True, with_stack=True)
            self._torch.step_num = iteration  # so the step spans read ProfilerStep#<iteration>
            self._torch.start()

    def _finish(self) -> None:
        self._active = False
        if self._torch is not None:
            self._torch.stop()  # calls _write_trace
            self._torch = None
        if self.cuda:
            torch.cuda.profiler.stop()
        memory_files = self.memory.finish() if self.memory is not None else []
        steps = self._steps_text()
        if self.trace_path is not None:
            print_rank_0(f"profiler trace of {steps}: {self.trace_path} (one "
                         f"rank<N>.*.pt.trace.json per rank; view with tensorboard --logdir "
                         f"{self.trace_dir}, or in ui.perfetto.dev)")
        if memory_files:
            what = (f"{memory_files[0]} (open in https://pytorch.org/memory_viz) and "
                    f"{memory_files[1]}" if self.cuda else
                    f"{memory_files[0]} (resident memory per step: without CUDA there is no "
                    "allocator snapshot)")
            print_rank_0(f"memory profile of {steps}: {what}; one per rank")

    def _steps_text(self) -> str:
        last = self.window[-1]
        if not self._done:
            return f"iteration {self.window[0]} (the run stopped during that step)"
        text = f"iterations {self._done[0]} to {self._done[-1]}"
        return text if self._done[-1] == last else f"{text} (the run stopped before {last})"

    def _write_trace(self, prof: torch.profiler.profile) -> None:
        directory = Path(self.trace_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.trace_path = directory / f"rank{self.rank}.{time.time_ns()}.pt.trace.json"
        prof.export_chrome_trace(str(self.trace_path))


def _record_every_step(step: int) -> ProfilerAction:
    """A schedule (which makes torch mark each step) that records until `stop()`."""
    return ProfilerAction.RECORD


def label_pipeline_phases(pipe_engine) -> None:
    """Run each instruction of DeepSpeed's pipeline schedule inside a `record_function` named
    after its phase (the engine looks instructions up in `self._INSTRUCTION_MAP`, so a map on
    the instance replaces the class's for this engine only)."""
    from deepspeed.runtime.pipe import schedule

    table = getattr(type(pipe_engine), "_INSTRUCTION_MAP", None)
    if table is None:
        log.warning("profile: this DeepSpeed's pipeline engine has no _INSTRUCTION_MAP, so the "
                    "trace shows its steps without phase labels")
        return
    names = {schedule.LoadMicroBatch: GET_BATCH, schedule.ForwardPass: FORWARD,
             schedule.BackwardPass: BACKWARD, schedule.OptimizerStep: OPTIMIZER_STEP}
    pipe_engine._INSTRUCTION_MAP = {kind: _labelled(run, names.get(kind, kind.__name__))
                                    for kind, run in table.items()}


def _labelled(run, name: str):
    def labelled(self, *args, **kwargs):
        with record_function(name):
            return run(self, *args, **kwargs)
    return labelled
