#!/usr/bin/env python
"""Mixture-of-experts cost: an MoE layer against the dense MLP with the same active parameters,
and whole training steps of an MoE model against the dense model of the same active size,
measured in the same run, interleaved.

    .venv/bin/python bench/moe.py                                  # CPU defaults, about 2 minutes
    .venv/bin/python bench/moe.py --hidden 768 --tokens 8192 --experts 8 --top-k 2
    .venv/bin/python bench/moe.py --dtype bf16                     # on a GPU: bf16 on CUDA

Layer: tokens [T, h] through (a) the dense MLP of width f * top_k (the same FLOPs a token
spends in its k experts of width f) and (b) the MoE layer (router, Sinkhorn or top-k choice,
sorting tokens by expert, the experts' products, the weighted scatter back), forward and
backward. Then (c) the experts' products alone on the same sorted rows, so the routing and
permutation overhead is (b) - (c) and the products' own cost against the dense MLP is (c) / (a).

Step: GPTModel forward, backward and an AdamW step, dense (MLP width f * top_k) against MoE
(experts of width f in every `--interval`th layer), same attention and batch. The MoE model
holds more parameters (experts x f per MoE layer), so its optimizer step costs more too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def model_config(opts, moe: bool):
    from megatron.model.config import ModelConfig

    width = opts.ffn if moe else opts.ffn * opts.top_k
    extra = dict(moe_num_experts=opts.experts, moe_top_k=opts.top_k,
                 moe_router_type=opts.router, moe_expert_interval=opts.interval) if moe else {}
    return ModelConfig(num_layers=opts.layers, hidden_size=opts.hidden,
                       num_attention_heads=opts.hidden // 64, num_kv_heads=opts.hidden // 64,
                       intermediate_size=width, seq_length=opts.seq,
                       max_position_embeddings=opts.seq, padded_vocab_size=opts.vocab,
                       use_bias_in_mlp=False, **extra)


def layer_times(opts, dtype) -> dict[str, float]:
    import torch

    from megatron.model.init import init_methods, layer_generator
    from megatron.model.mlp import MLP
    from megatron.model.moe import MoE

    dense_cfg, moe_cfg = model_config(opts, False), model_config(opts, True)
    fns = init_methods(dense_cfg)
    dense = MLP(dense_cfg, *fns, layer_generator(1, 1)).to(device(), dtype)
    moe = MoE(moe_cfg, *fns, layer_generator(1, 1)).to(device(), dtype)
    x = torch.randn(opts.tokens, opts.hidden, device=device(), dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    with torch.no_grad():  # the routing of x, for the products on their own
        routing = moe.router(x)
        expert_of = routing.experts.reshape(-1)
        rows = x[torch.argsort(expert_of, stable=True) // opts.top_k].detach()
        counts = torch.bincount(expert_of, minlength=opts.experts).tolist()
    rows.requires_grad_()
    rows_grad = torch.randn_like(rows)

    def run(module, inputs, g):
        return lambda: module(inputs).backward(g)

    cases = {"dense MLP": run(dense, x.unsqueeze(0), grad.unsqueeze(0)),
             "MoE layer": run(moe, x.unsqueeze(0), grad.unsqueeze(0)),
             "expert products": lambda: moe.experts(rows, counts).backward(rows_grad)}
    return interleaved(cases, opts.repeats)


def step_times(opts, dtype) -> dict[str, float]:
    import torch

    from megatron.model.gpt import GPTModel, lm_loss

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, opts.vocab, (opts.micro, opts.seq + 1), generator=g).to(device())
    positions = torch.arange(opts.seq, device=device()).expand(opts.micro, opts.seq)
    targets = (tokens[:, 1:], torch.ones(opts.micro, opts.seq, device=device()))
    cases = {}
    for name, moe in (("dense model", False), ("MoE model", True)):
        model = GPTModel(model_config(opts, moe)).to(device(), dtype)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(model=model, optimizer=optimizer):
            loss = lm_loss(model(tokens[:, :-1], positions), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        cases[name] = step
        params = sum(p.numel() for p in model.parameters())
        print(f"  {name}: {params / 1e6:.1f}M parameters", flush=True)
    return interleaved(cases, opts.repeats)


def interleaved(cases: dict, repeats: int) -> dict[str, float]:
    """Each case timed `repeats` times in turn, round-robin, so load on the machine hits all
    alike; the median of each."""
    out = {name: [] for name in cases}
    for name, fn in cases.items():
        fn()  # warm-up
    for _ in range(repeats):
        for name, fn in cases.items():
            out[name].append(timed(fn, 1))
    return {name: statistics.median(t) for name, t in out.items()}


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048, help="each expert's width")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--router", default="sinkhorn", choices=("sinkhorn", "topk"))
    p.add_argument("--tokens", type=int, default=4096, help="tokens through the layer")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--repeats", type=int, default=5)
    opts = p.parse_args(argv)
    dtype = torch.float32 if opts.dtype == "fp32" else torch.bfloat16
    torch.manual_seed(0)
    print(f"device: {device()} ({torch.get_num_threads()} threads), {opts.dtype}; "
          f"{opts.experts} experts of width {opts.ffn}, top {opts.top_k}, {opts.router} router; "
          f"dense width {opts.ffn * opts.top_k}", flush=True)
    layer = layer_times(opts, dtype)
    dense, moe, products = (layer[k] for k in ("dense MLP", "MoE layer", "expert products"))
    print(f"layer, {opts.tokens} tokens x {opts.hidden}, forward + backward:")
    for name, seconds in layer.items():
        print(f"  {name:<16} {seconds * 1e3:9.1f} ms  {seconds / dense:5.2f}x dense")
    print(f"  routing and permutation: {(moe - products) * 1e3:.1f} ms "
          f"({(moe - products) / dense:.0%} of the dense MLP)")
    print(f"step, {opts.layers} layers, MoE every {opts.interval}, micro {opts.micro} x seq "
          f"{opts.seq}, forward + backward + AdamW:")
    steps = step_times(opts, dtype)
    for name, seconds in steps.items():
        print(f"  {name:<16} {seconds * 1e3:9.1f} ms  {seconds / steps['dense model']:5.2f}x dense")
    return 0


if __name__ == "__main__":
    sys.exit(main())
