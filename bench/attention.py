"""Causal attention on CPU tensors, forward and backward: our blocked kernel
(megatron/model/cpu_attention.py) against torch SDPA, measured alternately in the same run.

    python bench/attention.py                        # the default grid, bf16 and fp32
    python bench/attention.py --shapes 4,12,512,64 --dtypes bf16 --repeats 15

Each shape is batch,heads,positions,head_dim. A line per shape and dtype gives the median time of
each side, the median of the per-repeat ratios SDPA/ours (above 1: ours is faster) with its
range, and which of the two the model calls for that shape (`cpu_attention.supports`).
The output goes back to [b, s, h * d] as megatron/model/attention.py reshapes it, so the output
gradient reaches each kernel in the strided layout it meets in training. Both run with the
host-memory setting train.py's CPU workers make (megatron/training/host_memory.py: freed memory
stays in the heap), as in training; `--allocator default` leaves glibc's defaults, under which
every large tensor is mapped afresh and its pages faulted in again at each call.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_SHAPES = ["16,12,128,64", "8,12,256,64", "4,12,512,64", "2,12,768,64",
                  "2,12,1024,64", "1,12,2048,64", "2,16,512,128", "1,16,2048,128"]


def seconds(fn, q, k, v, grad) -> float:
    b, h, s, d = q.shape
    start = time.perf_counter()
    fn(q, k, v).transpose(1, 2).reshape(b, s, h * d).backward(grad)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=["bf16", "fp32"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--allocator", choices=["framework", "default"], default="framework",
                        help="the host-memory setting of train.py's CPU workers (framework) "
                             "or glibc's defaults")
    opts = parser.parse_args(argv)
    if opts.allocator == "framework":
        from megatron.training.host_memory import keep_freed_memory

        keep_freed_memory()
    import torch
    import torch.nn.functional as F

    from megatron.model import cpu_attention

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"allocator: {opts.allocator}")
    for shape in opts.shapes:
        b, h, s, d = (int(x) for x in shape.split(","))
        for name in opts.dtypes:
            dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
            q, k, v = (torch.randn(b, h, s, d, dtype=dtype, requires_grad=True) for _ in range(3))
            grad = torch.randn(b, s, h * d, dtype=dtype)
            ours_fn = cpu_attention.blocked_causal_attention
            seconds(sdpa, q, k, v, grad), seconds(ours_fn, q, k, v, grad)  # warm-up
            theirs, ours = [], []
            for _ in range(opts.repeats):
                theirs.append(seconds(sdpa, q, k, v, grad))
                ours.append(seconds(ours_fn, q, k, v, grad))
            ratios = [t / o for t, o in zip(theirs, ours)]
            used = "ours" if cpu_attention.supports(q, k, None, 0.0) else "SDPA"
            print(f"b{b} h{h} s{s} d{d} {name}: SDPA {statistics.median(theirs) * 1e3:7.1f} ms, "
                  f"ours {statistics.median(ours) * 1e3:7.1f} ms, SDPA/ours "
                  f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); "
                  f"the model uses {used}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
