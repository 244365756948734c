"""Operator calls of a bf16 training step, DeepSpeed's per-parameter optimizer loops against the
multi-tensor ones of megatron/training/optimizer_loops.py, at ZeRO 0 (DeepSpeed's bf16
optimizer) and ZeRO 1 on a one-stage pipeline, and on a plain module (pipe_parallel_size 0:
DeepSpeed's fp16 wrapper, FP16_UnfusedOptimizer, which fp16 runs get on every layout). A count, not a timing: each call that computes (not a view: view,
slice, detach) is a kernel launch on a GPU, where a small model's step is bound by launching
kernels.

    python bench/optimizer_ops.py                     # 125M-shaped: 12 layers x 768, seq 128
    python bench/optimizer_ops.py --layers 2 --hidden 64
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _count(rank, world, tmp: str, fused: bool, zero: int, shape: dict, pipe: int) -> tuple:
    """(optimizer type, its calls in one step and those that compute, the whole step's calls and
    those that compute) in a worker process."""
    import megatron.training.engine as engine_module
    from megatron.training.step import train_step
    from tests.checkpointing import engines
    from tests.training.test_optimizer_loops import OpCount

    if not fused:  # DeepSpeed's own loops
        engine_module.fuse_optimizer_loops = lambda optimizer: False
    args = engines.make_args(Path(tmp), bf16={"enabled": True}, train_micro_batch_size_per_gpu=1,
                             zero_optimization={"stage": zero}, pipe_parallel_size=pipe,
                             **shape)
    engine = engines.build(args)
    optimizer = engine.engine.optimizer
    engines.train(engine, args, 1)
    inner = OpCount()
    for name in ("step", "update_hp_grads"):
        if hasattr(optimizer, name):
            method = getattr(optimizer, name)

            def counted(*a, _method=method, **k):
                with inner:
                    return _method(*a, **k)

            setattr(optimizer, name, counted)
    whole = OpCount()
    data = engines.batches(1, args, 0)
    with whole:
        train_step(engine, data)
    return (type(optimizer).__name__, sum(inner.ops.values()), inner.computing(),
            sum(whole.ops.values()), whole.computing())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from tests.distributed import run_distributed

    shape = dict(num_layers=args.layers, hidden_size=args.hidden,
                 num_attention_heads=args.heads, seq_length=args.seq,
                 max_position_embeddings=args.seq)
    print(f"bf16, {args.layers} layers x {args.hidden}, seq {args.seq}, micro batch 1, one process")
    print("calls: every operator call; computing: those that are not views (view, slice, "
          "detach, ...),\nthe ones that launch a kernel on a GPU")
    print(f"{'ZeRO':>4} {'optimizer':>22} | {'optimizer calls':>22} | {'computing':>22} | "
          f"{'step calls':>22} | {'computing':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        # a one-stage pipeline (GPT-NeoX's default) at ZeRO 0 and 1, and a plain module
        # (pipe_parallel_size 0), which DeepSpeed gives its fp16 wrapper even for bf16
        for zero, pipe in ((0, 1), (1, 1), (0, 0)):
            rows = {fused: run_distributed(_count, 1, str(Path(tmp) / f"{zero}{pipe}{fused}"),
                                           fused, zero, shape, pipe)[0]
                    for fused in (False, True)}
            kind = rows[True][0]
            cells = [f"{theirs:>6,} -> {ours:>5,} {theirs / ours:>5.1f}x"
                     for theirs, ours in zip(rows[False][1:], rows[True][1:])]
            print(f"{zero:>4} {kind:>22} | " + " | ".join(cells))

if __name__ == "__main__":
    main()
