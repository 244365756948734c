#!/usr/bin/env python
"""Checkpoint file I/O benchmark: our durable save / verified load against torch.save / torch.load.

    .venv/bin/python bench/checkpoint.py                     # 1 GiB state, 5 repeats
    .venv/bin/python bench/checkpoint.py --gib 0.25 --repeats 2   # a quick smoke run

The state is a model+optimizer-like dict of fp32 tensors (weights, two Adam moments) of about
`--gib` GiB, written to one file in a temporary directory under `--dir` (removed at the end).
Each repeat runs every variant once, interleaved; the table keeps each variant's best and median
wall time (the machine may be shared) and the CPU time (all threads) of the best run. The page
cache is warm for every load: the file was just written, which is also the case that stresses
CPU (hashing) rather than the disk.

    save  torch.save(state, path)                    the reference (no fsync)
          torch.save + fsync                         for scale: what durability alone costs
          torch.save, no zip CRC32                   for scale: without the per-record CRC32
                                                     (which torch.load never checks)
          durable.write_torch(state, path)           ours: no CRC32, sha256 on a helper thread
                                                     while the bytes are written, then fsync
    load  torch.load(path)                           the reference
          durable.load_torch_verified(path, record)  ours: size and sha256 checked, then
                                                     torch.load(mmap=True): tensors are mapped
                                                     from the page cache, read when used (lazy)
          ... -> copy into model                     both of the above followed by copy_ into
                                                     preallocated tensors (load_state_dict), so
                                                     every byte is read: the fair comparison
Targets: save <= 1.3x torch.save (checksum and fsync included), verified load into a model
<= 1.2x torch.load into a model. load_checkpoint does the same per file: each rank hashes its
share of the files, then DeepSpeed reads them through torch.load(mmap=True).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron.checkpointing import durable  # noqa: E402


def make_state(gib: float) -> dict[str, torch.Tensor]:
    """Weights and two moment buffers, in 64 MiB tensors, about `gib` GiB in all."""
    per_tensor = 16 * 2**20  # fp32 elements = 64 MiB
    n = max(3, round(gib * 2**30 / (per_tensor * 4)))
    gen = torch.Generator().manual_seed(0)
    kinds = ("weight", "exp_avg", "exp_avg_sq")
    return {f"{kinds[i % 3]}.{i}": torch.randn(per_tensor, generator=gen) for i in range(n)}


def torch_save_fsync(state, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def torch_save_no_crc(state, path: Path) -> None:
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(state, path)
    finally:
        torch.serialization.set_crc32_options(True)


def into(dest: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor]) -> None:
    for name, tensor in loaded.items():
        dest[name].copy_(tensor)


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads)."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def run(gib: float, repeats: int, directory: str) -> dict[str, list[tuple[float, float]]]:
    state = make_state(gib)
    size = sum(t.numel() * t.element_size() for t in state.values())
    print(f"state: {len(state)} tensors, {size / 2**30:.2f} GiB; {repeats} repeats; "
          f"{os.cpu_count()} CPUs", flush=True)
    times: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "state.pt"
        dest = {name: torch.empty_like(t) for name, t in state.items()}
        record = durable.write_torch(state, path)
        for _ in range(repeats):
            saves = {"torch.save": lambda: torch.save(state, path),
                     "torch.save + fsync": lambda: torch_save_fsync(state, path),
                     "torch.save, no zip CRC32": lambda: torch_save_no_crc(state, path),
                     "durable.write_torch": lambda: durable.write_torch(state, path)}
            for name, fn in saves.items():
                times.setdefault(name, []).append(timed(fn))
            record = durable.write_torch(state, path)
            def plain():
                return torch.load(path, weights_only=False)

            def ours():
                return durable.load_torch_verified(path, record)

            loads = {"torch.load": plain, "load_torch_verified (lazy)": ours,
                     "torch.load -> model": lambda: into(dest, plain()),
                     "load_torch_verified -> model": lambda: into(dest, ours())}
            for name, fn in loads.items():
                times.setdefault(name, []).append(timed(fn))
        loaded = durable.load_torch_verified(path, record)
        assert all(torch.equal(loaded[k], v) for k, v in state.items())
    return times


def report(times: dict[str, list[tuple[float, float]]]) -> None:
    rows = [("save", "torch.save", "torch.save", None),
            ("save", "torch.save + fsync", "torch.save", None),
            ("save", "torch.save, no zip CRC32", "torch.save", None),
            ("save", "durable.write_torch", "torch.save", 1.3),
            ("load", "torch.load", "torch.load", None),
            ("load", "load_torch_verified (lazy)", "torch.load", None),
            ("load", "torch.load -> model", "torch.load -> model", None),
            ("load", "load_torch_verified -> model", "torch.load -> model", 1.2)]
    print(f"{'':5} {'variant':29} {'best s':>7} {'median s':>8} {'cpu s':>6} {'best/ref':>8} "
          f"{'target':>12}")
    for kind, name, ref, target in rows:
        best = min(times[name])
        median = statistics.median(w for w, _ in times[name])
        ratio = best[0] / min(times[ref])[0]
        verdict = "" if target is None else f"<={target}x {'ok' if ratio <= target else 'MISSED'}"
        print(f"{kind:5} {name:29} {best[0]:7.3f} {median:8.3f} {best[1]:6.2f} {ratio:7.2f}x "
              f"{verdict:>12}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="state size in GiB")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where to write (the filesystem under test)")
    args = parser.parse_args(argv)
    report(run(args.gib, args.repeats, args.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
