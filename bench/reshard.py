#!/usr/bin/env python
"""Resharding cost: loading a checkpoint at another parallel layout against loading it at the
layout that saved it, same checkpoint, same run.

    .venv/bin/python bench/reshard.py                          # hidden 768, 8 layers, 2 ranks
    .venv/bin/python bench/reshard.py --hidden 256 --layers 2  # a quick smoke run

A model (fp32, Adam) is trained one step at tensor parallelism 2 on two gloo processes and
saved; then fresh processes load it (a) at tensor parallelism 2 (DeepSpeed reads its own
files: the reference) and (b) at pipeline parallelism 2 (every rank reads its layers' files,
merges the tensor-parallel shards and takes its part). Only `load_checkpoint` is timed
(checksum verification included in both), best of --repeats. The page cache is warm.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.distributed import run_distributed  # noqa: E402


def _shape(hidden: int, layers: int) -> dict:
    return {"hidden_size": hidden, "num_layers": layers, "num_attention_heads": 8,
            "hidden_dropout": 0.0}


def _save(rank, world, run_dir, shape):
    from megatron.checkpointing import save_checkpoint
    from tests.checkpointing import engines

    args = engines.make_args(Path(run_dir), model_parallel_size=2, pipe_parallel_size=1, **shape)
    engine = engines.build(args)
    engines.train(engine, args, 1)
    save_checkpoint(engine, args.checkpoint, 1, {})
    return sum(p.numel() for p in engine.engine.module.parameters())


def _load(rank, world, run_dir, shape, layout, repeats):
    import torch.distributed as dist

    from megatron.checkpointing import load_checkpoint
    from tests.checkpointing import engines

    args = engines.make_args(Path(run_dir), **layout, **shape)
    engine = engines.build(args)
    best = float("inf")
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        load_checkpoint(engine, args.checkpoint)
        dist.barrier()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    shape = _shape(opts.hidden, opts.layers)
    with tempfile.TemporaryDirectory() as run_dir:
        params = sum(run_distributed(_save, 2, run_dir, shape))
        size = sum(f.stat().st_size for f in (Path(run_dir) / "ckpt").rglob("*") if f.is_file())
        same = run_distributed(_load, 2, run_dir, shape,
                               {"model_parallel_size": 2, "pipe_parallel_size": 1}, opts.repeats)
        other = run_distributed(_load, 2, run_dir, shape,
                                {"model_parallel_size": 1, "pipe_parallel_size": 2}, opts.repeats)
    print(f"checkpoint: {params:,} parameter values on the 2 ranks (tp2), "
          f"{size / 2**20:.0f} MiB on disk")
    print(f"load at the saving layout (tp2):        {max(same):7.2f} s")
    print(f"load resharded (tp2 -> pp2):            {max(other):7.2f} s   "
          f"{max(other) / max(same):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
