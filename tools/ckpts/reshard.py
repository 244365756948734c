#!/usr/bin/env python
r"""Rewrite a checkpoint at another parallel layout (tensor / pipeline / data-parallel degree,
ZeRO stage 0-3, fp32 or bf16), without training. Runs on the workers of the new layout:

    python deepy.py tools/ckpts/reshard.py configs/tiny.yml \
        load=checkpoints/tiny save=checkpoints/tiny_tp2 model_parallel_size=2

Training at another layout does not need this: loading reshards by itself. Use it to keep a
checkpoint on disk in the new layout. The state is kept whole: weights, fp32 master copies,
optimizer state, LR schedule (the checkpoint's, whatever the config's train_iters and lr; with
override_lr_scheduler the config's), data position; `iteration=<N>` picks a checkpoint.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.entry import run_entry  # noqa: E402
from megatron.launcher import worker_args  # noqa: E402


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv

    def run() -> None:
        from megatron.training.relayout import reshard

        reshard(worker_args(argv))

    return run_entry(run)


if __name__ == "__main__":
    sys.exit(main())
