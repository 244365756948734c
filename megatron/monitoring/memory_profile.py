"""`memory_profiling`: the memory one rank holds over the profiled steps, written to files.

Every rank writes into `memory_profiling_path`:

- `memory_timeline_rank<N>.json`, one entry per profiled step, read when the step ends:
  `{"iteration", "rss_bytes", "peak_rss_bytes"}` (the process's resident memory now and its
  peak so far), plus on CUDA `cuda_allocated_bytes`, `cuda_reserved_bytes` and
  `cuda_step_peak_bytes` (the allocator's peak within that step);
- on CUDA, `mem_snapshot_rank<N>.pickle`: the caching allocator's snapshot with the history of
  every allocation made during the profiled steps (`torch.cuda.memory._record_memory_history`),
  dumped after the last one. Drop it on https://pytorch.org/memory_viz to see each allocation's
  stack. GPT-NeoX writes the same snapshot as `mem_snapshot.pickle`, from rank 0 only.

There is no allocator snapshot without CUDA, so on CPU the timeline is the memory profile.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import psutil
import torch

MAX_HISTORY_ENTRIES = 100_000  # allocation events kept for the snapshot, as in GPT-NeoX


def peak_rss_bytes() -> int:
    """This process's peak resident memory: the kernel's high-water mark of its own address
    space (VmHWM). Not getrusage's ru_maxrss: Linux carries that over an exec from the process
    that forked it, so a program started from a large one (a test runner, a launcher) reports
    the parent's resident size as its own peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class MemoryRecorder:
    """Reads memory around each profiled step of one rank and writes it when asked."""

    def __init__(self, directory: str | Path, rank: int, cuda: bool):
        self.directory = Path(directory)
        self.rank = rank
        self.cuda = cuda
        self.steps: list[dict] = []
        self._process = psutil.Process()

    @property
    def timeline_path(self) -> Path:
        return self.directory / f"memory_timeline_rank{self.rank}.json"

    @property
    def snapshot_path(self) -> Path:
        return self.directory / f"mem_snapshot_rank{self.rank}.pickle"

    def start(self) -> None:
        """Begin the record (before the first profiled step)."""
        if self.cuda:
            torch.cuda.memory._record_memory_history(max_entries=MAX_HISTORY_ENTRIES)

    def before_step(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def after_step(self, iteration: int) -> None:
        """Add the timeline entry of the step that completed `iteration`."""
        rss = self._process.memory_info().rss
        peak = max(rss, peak_rss_bytes())  # the high-water mark is updated lazily: it can trail
        entry = {"iteration": iteration, "rss_bytes": rss, "peak_rss_bytes": peak}
        if self.cuda:
            entry.update(cuda_allocated_bytes=torch.cuda.memory_allocated(),
                         cuda_reserved_bytes=torch.cuda.memory_reserved(),
                         cuda_step_peak_bytes=torch.cuda.max_memory_allocated())
        self.steps.append(entry)

    def finish(self) -> list[Path]:
        """Stop recording and write the files; returns their paths."""
        self.directory.mkdir(parents=True, exist_ok=True)
        written = []
        if self.cuda:
            torch.cuda.memory._dump_snapshot(str(self.snapshot_path))
            torch.cuda.memory._record_memory_history(enabled=None)
            written.append(self.snapshot_path)
        record = {"rank": self.rank, "device": "cuda" if self.cuda else "cpu", "steps": self.steps}
        self.timeline_path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        written.append(self.timeline_path)
        return written
