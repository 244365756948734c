#!/usr/bin/env python
"""Mamba speed: the chunked selective scan against the step-by-step reference, and a model of
Mamba layers against an attention model of the same depth and width, measured in the same run,
interleaved.

    .venv/bin/python bench/mamba.py                          # CPU defaults, a few minutes
    .venv/bin/python bench/mamba.py --hidden 768 --seq 2048 --layers 4

Scan: selective_scan over [batch, 2 * hidden, seq] with a state of 16, forward and forward +
backward, `reference` against `chunked` (megatron/model/selective_scan.py).

Model: GPTModel forward + backward over [batch, seq] tokens: Mamba layers only (reference
scan; chunked scan, mamba_selective_scan_fusion) against global-attention layers (torch SDPA),
tokens per second. The two hold different parameters at the same width (a Mamba layer ~6 h^2,
a transformer layer ~12 h^2); both counts are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` runs after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def scan_case(args, method: str, backward: bool):
    import torch

    from megatron.model.selective_scan import selective_scan

    g = torch.Generator().manual_seed(0)
    b, d, n, l = args.batch, 2 * args.hidden, 16, args.seq
    u = torch.randn(b, d, l, generator=g, requires_grad=backward)
    delta = (torch.randn(b, d, l, generator=g) - 4).requires_grad_(backward)
    a = -torch.rand(d, n, generator=g).add(0.5).requires_grad_(backward)
    bb = torch.randn(b, n, l, generator=g, requires_grad=backward)
    cc = torch.randn(b, n, l, generator=g, requires_grad=backward)
    z = torch.randn(b, d, l, generator=g, requires_grad=backward)

    def run():
        with torch.set_grad_enabled(backward):
            y = selective_scan(u, delta, a, bb, cc, None, z, None, True, method=method)
            if backward:
                y.sum().backward()
    return run


def model_case(args, kind: str):
    import torch

    from megatron.model.config import ModelConfig
    from megatron.model.gpt import GPTModel, lm_loss

    types = ("global",) if kind == "attention" else ("mamba",)
    config = ModelConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.hidden // 64,
        num_kv_heads=args.hidden // 64, intermediate_size=4 * args.hidden,
        seq_length=args.seq, max_position_embeddings=args.seq, padded_vocab_size=args.vocab,
        norm="rmsnorm", pos_emb="rotary" if kind == "attention" else "none",
        attention_types=types * args.layers, mamba_inner_size=2 * args.hidden,
        mamba_selective_scan_fusion=kind == "mamba chunked")
    model = GPTModel(config)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    positions = torch.arange(args.seq).expand_as(tokens)
    mask = torch.ones_like(tokens, dtype=torch.float32)

    def run():
        loss = lm_loss(model(tokens, positions), (tokens, mask))
        loss.backward()
    return run, sum(p.numel() for p in model.parameters())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; hidden {args.hidden}, "
          f"seq {args.seq}, batch {args.batch}")
    for backward in (False, True):
        what = "forward + backward" if backward else "forward"
        ref = timed(scan_case(args, "reference", backward), args.repeats)
        fast = timed(scan_case(args, "chunked", backward), args.repeats)
        print(f"scan {what:<18}  reference {ref * 1e3:9.1f} ms   chunked {fast * 1e3:9.1f} ms"
              f"   chunked is {ref / fast:5.2f}x the reference's speed")
    tokens = args.batch * args.seq
    results = {}
    for kind in ("attention", "mamba reference", "mamba chunked"):
        run, params = model_case(args, kind)
        results[kind] = (timed(run, args.repeats), params)
    base = results["attention"][0]
    for kind, (seconds, params) in results.items():
        print(f"model {kind:<16} {args.layers} layers, {params:>11,} params: "
              f"{tokens / seconds:9.0f} tokens/s ({seconds * 1e3:8.1f} ms/step, "
              f"{base / seconds:5.2f}x attention's speed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
