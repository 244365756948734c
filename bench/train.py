"""Training-step throughput: our DeepSpeed step against Hugging Face GPTNeoXForCausalLM trained
with torch AdamW in a plain loop, same dimensions, batch and dtype, measured in the same run;
plus MFU against the best matmul peak measured here too (bf16, or fp32 where that is faster:
on CPUs whose bf16 kernels are slower, bf16 products run in fp32, megatron/mpu/products.py).

    python bench/train.py                                # tiny and 125M-class, fp32 and bf16
    python bench/train.py --sizes tiny --dtypes bf16 --steps 3
    python bench/train.py --sizes 125m --rounds 3        # the median ratio of three rounds
    python bench/train.py --sizes 125m 1-3b --seq 2048 --micro 8 --dtypes bf16   # on a GPU
    python bench/train.py --sizes 125m --seq 2048 --micro 8 --dtypes bf16 fp16 \
        --fusions config on --profile 15                    # with the fusion flags, kernels

`--fusions config on` runs our model once with the fusion flags as the size's config file sets
them (GPT-NeoX's: off) and once with layernorm, rope, bias_gelu and bias_dropout fusion on
(the Triton kernels on a GPU); `compile` adds `torch_compile: true` to those flags (each
transformer layer through torch.compile, as the compiled reference's layers are; fp32 only on a
CPU, megatron/model/compile.py). `--profile N` prints the N operators with the most device time
in one more of our steps. Each of our runs is printed as soon as it is measured, and again
beside the reference once that has run (a compiled reference can take minutes to compile).

bf16 means DeepSpeed's bf16 mode for us (bf16 weights and activations, fp32 master weights in
the optimizer) and torch.autocast(bfloat16) with fp32 weights for the reference: both are the
mixed-precision recipe each stack ships. Data is random tokens (throughput only).

`--reference compiled` (the default on a GPU) runs the reference with fused AdamW and each of
its decoder layers through torch.compile (torch's regional compilation: the layers share one
compiled graph, so compiling takes about as long at 24 layers as at one; the embedding, final
norm and output layer run eager); `compiled-whole` compiles the whole model instead (one graph,
minutes of compiling at 1-3B); `eager` (the default on a CPU) runs it as it is. After
each of our runs a line says where our step's time went (forward, backward, optimizer step,
gradient reduction, the rest), timed around DeepSpeed's phases with the device synchronised,
and the peak memory (allocated on a GPU, the process's resident memory on a CPU) beside the
estimate deepy.py prints for the run.

Each side runs in a fresh process: ours set up as a train.py worker sets itself up (on a CPU
that includes keeping freed host memory, megatron/training/host_memory.py), the reference as a
plain script runs, with glibc's defaults; `--reference-allocator framework` gives the reference
the same host-memory setting, to show how much of the difference that setting is. On a CPU a
line gives each side's page faults per timed step (after the warm-up steps).

The reference multiplies in its dtype. On a CPU without bf16 instructions (AVX2 only, for
one) torch's bf16 matmul can run at well under 1 GFLOP/s, and one bf16 reference step of the
125M-class model would take hours: where the matmul peak measured for its dtype says its steps
need more than `--reference-limit` minutes, the reference is not run and a line says why.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = {  # config file, seq_length and micro batch for a CPU run
    "tiny": ("configs/tiny.yml", 128, 8),
    "125m": ("configs/125M.yml", 512, 4),
    "350m": ("configs/350M.yml", 512, 2),
    "1-3b": ("configs/1-3B.yml", 512, 1),
}
# GPT-NeoX's fusion flags that `--fusions on` sets (bias_gelu_fusion means GELU's tanh
# approximation; the reference then computes the same function, `gelu_pytorch_tanh`)
FUSION_FLAGS = ("layernorm_fusion", "rope_fusion", "bias_gelu_fusion", "bias_dropout_fusion")


def device():
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def matmul_peak(dtype: str, n: int = 2048) -> float:
    """Best matmul FLOP/s of a square product in `dtype` on this device: n x n x n (8192 on a
    GPU), or the largest power of two under n where one product takes a second or more (torch's
    bf16 products on a CPU without bf16 instructions run well under 1 GFLOP/s: five at 2048
    would take minutes before the bench prints anything)."""
    import torch

    if torch.cuda.is_available():
        n = 8192

    def seconds(a, b) -> float:
        sync()
        start = time.perf_counter()
        (a @ b).sum()
        sync()
        return time.perf_counter() - start

    size = min(256, n)
    while True:
        a = torch.randn(size, size, device=device(), dtype=getattr(torch, dtype))
        b = torch.randn(size, size, device=device(), dtype=getattr(torch, dtype))
        first = seconds(a, b)
        if size >= n or first >= 1.0:
            break
        size *= 2
    return max(2 * size**3 / t for t in [first] + [seconds(a, b) for _ in range(4)])


def flop_rate(flops: float) -> str:
    """A measured FLOP/s figure in TFLOP/s, or GFLOP/s where it is under one TFLOP/s."""
    if flops >= 1e12:
        return f"{flops / 1e12:.2f} TFLOP/s"
    return f"{flops / 1e9:.3g} GFLOP/s"


def neox_args(size: str, dtype: str, seq: int, micro: int, pipe: int, fusions: str = "config"):
    from megatron.neox_arguments import NeoXArgs

    path, _, _ = SIZES[size]
    bf16 = "{enabled: true}" if dtype == "bf16" else "{enabled: false}"
    # fp16: dynamic loss scaling from 2^16 (DeepSpeed's default, which GPT-NeoX's configs keep)
    fp16 = ("{enabled: true, loss_scale: 0, initial_scale_power: 16}" if dtype == "fp16"
            else "null")
    flags = [f"{flag}=true" for flag in FUSION_FLAGS] if fusions in ("on", "compile") else []
    flags += ["torch_compile=true"] if fusions == "compile" else []
    return NeoXArgs.from_ymls([str(ROOT / path)], [
        "num_gpus=1", f"seq_length={seq}", f"max_position_embeddings={seq}",
        f"train_micro_batch_size_per_gpu={micro}", f"train_batch_size={micro}",
        "gradient_accumulation_steps=null", f"bf16={bf16}", f"fp16={fp16}", *flags,
        "checkpoint_activations=false", "partition_activations=false",
        "synchronize_each_layer=false", "zero_optimization={stage: 0}", "hidden_dropout=0",
        "attention_dropout=0", "save=null", "load=null", "train_iters=100", "log_dir=null",
        "data_path=null", "vocab_file=null", "model_parallel_size=1",
        f"pipe_parallel_size={pipe}",
    ]).with_world_size(1)


def batches(vocab: int, micro: int, seq: int):
    import torch

    g = torch.Generator().manual_seed(0)
    while True:
        text = torch.randint(0, vocab, (micro, seq + 1), generator=g)
        tokens, labels = text[:, :-1].to(device()), text[:, 1:].to(device())
        positions = torch.arange(seq, device=device()).expand(micro, seq)
        yield ((tokens, positions, torch.zeros(1, dtype=torch.bool, device=device())),
               (labels, torch.ones(micro, seq, device=device())))


def time_steps(step, warmup: int, steps: int) -> tuple[float, float]:
    """(median seconds of the timed steps, page faults per timed step: the warm-up steps,
    which fault in the process's working memory once, are not counted)."""
    for _ in range(warmup):
        step()
    times, faults = [], page_faults()
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), (page_faults() - faults) / steps


# DeepSpeed's methods that run each phase of a step: the pipeline engine's instructions, or the
# plain engine's calls made by megatron.training.step
PHASES = {"pipeline": {"forward": "_exec_forward_pass", "backward": "_exec_backward_pass",
                       "optimizer": "_exec_optimizer_step", "reduce": "_exec_reduce_grads"},
          "plain": {"forward": "forward", "backward": "backward", "optimizer": "step",
                    "reduce": "allreduce_gradients"}}


class PhaseTimer:
    """Seconds spent in each phase of our step (device synchronised around each), by wrapping
    the engine's methods for the steps run while `active`."""

    def __init__(self, ds, pipeline: bool):
        self.seconds = {name: 0.0 for name in PHASES["plain"]}
        self.active = False
        self.inside = 0  # the plain engine's step reduces gradients inside `step`
        if pipeline:  # its schedule runs the class's functions from _INSTRUCTION_MAP
            table = dict(ds._INSTRUCTION_MAP)
            for name, method in PHASES["pipeline"].items():
                for kind, fn in table.items():
                    if fn.__name__ == method:
                        table[kind] = self._timed(name, fn)
            ds._INSTRUCTION_MAP = table
            return
        for name, method in PHASES["plain"].items():
            if hasattr(ds, method):
                setattr(ds, method, self._timed(name, getattr(ds, method)))

    def _timed(self, name, fn):
        def run(*args, **kwargs):
            if not self.active or self.inside:
                return fn(*args, **kwargs)
            sync()
            start = time.perf_counter()
            self.inside += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside -= 1
                sync()
                self.seconds[name] += time.perf_counter() - start
        return run

    def line(self, total: float) -> str:
        parts = [f"{name} {t / total:.0%}" for name, t in self.seconds.items()]
        rest = max(0.0, total - sum(self.seconds.values()))
        return "where our step's time went: " + ", ".join(parts) + f", other {rest / total:.0%}"


def page_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def bench_ours(args, vocab: int, warmup: int, steps: int, profile: int = 0):
    """(model config, median step seconds, the phase line, peak GiB allocated on CUDA or the
    process's peak resident GiB on a CPU, page faults per step, the profile table or None)."""
    import torch

    from megatron.model.config import model_config_from_args
    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.topology import Topology
    from megatron.training.engine import build_engine
    from megatron.training.step import train_step

    config = model_config_from_args(args, vocab)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    engine = build_engine(args, config, ProcessGroups.build(Topology(1, 1, 1)))
    data = batches(vocab, args.derived.train_micro_batch_size_per_gpu, args.model.seq_length)
    seconds, faults = time_steps(lambda: train_step(engine, data), warmup, steps)
    phases = PhaseTimer(engine.engine, engine.is_pipeline)
    phases.active = True
    start = time.perf_counter()
    time_steps(lambda: train_step(engine, data), 0, steps)
    timed = time.perf_counter() - start  # the phases' share of these steps' wall time
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:  # the process's peak resident memory
        from megatron.monitoring.memory_profile import peak_rss_bytes

        peak = peak_rss_bytes() / 2**30
    phases.active = False
    table = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as profiler

        cuda = torch.cuda.is_available()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profiler(activities=activities) as prof:
            train_step(engine, data)
            sync()
        table = prof.key_averages().table(
            sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=profile)
    return config, seconds, phases.line(timed), peak, faults, table


def hf_model(config):
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf = GPTNeoXConfig(
        vocab_size=config.padded_vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, rotary_pct=config.rotary_pct,
        rotary_emb_base=config.rotary_emb_base, max_position_embeddings=config.max_position_embeddings,
        layer_norm_eps=config.norm_epsilon, use_parallel_residual=config.gpt_j_residual,
        hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=config.tied_embeddings,
        attn_implementation="sdpa",
        hidden_act="gelu_pytorch_tanh" if config.bias_gelu_fusion else "gelu")
    return GPTNeoXForCausalLM(hf).to(device()).to(torch.float32)


def bench_hf(config, dtype: str, micro: int, warmup: int, steps: int, compiled: str) -> tuple:
    """(median step seconds, page faults per step, graphs compiled or None) of the reference;
    `compiled`: "" (eager), "layers" (each decoder layer through torch.compile) or "whole"
    (the model through torch.compile)."""
    import torch

    model = hf_model(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.01, fused=bool(compiled))
    # a region recompiled past dynamo's limit would run eager, unseen: fail instead
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if compiled == "layers":  # torch's regional compilation: one graph, reused by every layer
        for layer in model.gpt_neox.layers:
            layer.compile()
    elif compiled:
        model = torch.compile(model)
    data = batches(config.padded_vocab_size, micro, config.seq_length)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    autocast = torch.autocast(device_type=device().type, dtype=half or torch.float32,
                              enabled=half is not None)
    # fp16: torch's dynamic loss scaler, as a plain mixed-precision script uses it
    scaler = torch.amp.GradScaler(device().type, init_scale=2.0**16, enabled=dtype == "fp16")

    def step():
        (tokens, _, _), (labels, _) = next(data)
        with autocast:
            logits = model(input_ids=tokens, use_cache=False).logits  # no KV cache to fill
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    seconds, faults = time_steps(step, warmup, steps)
    if not compiled:
        return seconds, faults, None
    from torch._dynamo.utils import counters

    return seconds, faults, counters["stats"]["unique_graphs"]


def measure(side: str, opts, size: str, dtype: str, seq: int, micro: int,
            fusions: str = "config") -> dict:
    """One side's figures, measured in this (fresh) process: "ours" set up as train.py's
    worker sets itself up, "hf" as a plain script runs (unless --reference-allocator
    framework)."""
    os.environ.update({k: os.environ.get(k, v) for k, v in dict(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29517").items()})
    from megatron.monitoring.logger import setup_logging
    from megatron.mpu.initialize import init_distributed
    from megatron.training.host_memory import keep_freed_memory

    setup_logging("warning")
    args = neox_args(size, dtype, seq, micro, opts.pipe_parallel_size, fusions)
    vocab = 50304 if size != "tiny" else 8192
    compiled = {"compiled": "layers", "compiled-whole": "whole"}.get(opts.reference, "")
    if device().type == "cpu" and (side == "ours" or opts.reference_allocator == "framework"):
        keep_freed_memory()  # what train.py does on the CPU accelerator
    if side == "hf":
        from megatron.model.config import model_config_from_args

        seconds, faults, graphs = bench_hf(model_config_from_args(args, vocab), dtype, micro,
                                           opts.warmup, opts.steps, compiled)
        return {"seconds": seconds, "faults": faults, "graphs": graphs}
    init_distributed("auto", 5.0)
    config, seconds, phases, allocated, faults, table = bench_ours(
        args, vocab, opts.warmup, opts.steps, opts.profile)
    from megatron.model.compile import graphs_compiled

    return {"seconds": seconds, "faults": faults, "phases": phases, "allocated": allocated,
            "config": config, "profile": table, "graphs": graphs_compiled()}


def in_fresh_process(*args) -> dict:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "125m"], choices=sorted(SIZES))
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"],
                        choices=["fp32", "bf16", "fp16"],
                        help="fp16 (GPU only): DeepSpeed's fp16 with dynamic loss scaling for us, "
                             "autocast(float16) with torch's GradScaler for the reference")
    parser.add_argument("--fusions", nargs="+", default=["config"],
                        choices=["config", "on", "compile"],
                        help="our model's fusion flags as the size's config file sets them "
                             "(GPT-NeoX's configs: off), or on: " + ", ".join(FUSION_FLAGS) +
                             ", or compile: those flags and torch_compile (each transformer "
                             "layer through torch.compile); one row of ours per choice, one "
                             "reference run (built like the first choice)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after each of our runs, the N operators with the most device time "
                             "in one more step (torch.profiler)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure each size and dtype this many times, ours and the "
                             "reference alternating, each in a fresh process, then print the "
                             "median ratio and its range (one run each can mislead on a shared "
                             "machine)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seq", type=int, default=None, help="override the size's seq_length")
    parser.add_argument("--micro", type=int, default=None, help="override the micro batch")
    parser.add_argument("--reference", choices=["compiled", "compiled-whole", "eager"],
                        default=None,
                        help="the reference with fused AdamW and each decoder layer through "
                             "torch.compile (compiled), or the whole model (compiled-whole: "
                             "minutes more of compiling), or eager with AdamW (default: compiled "
                             "on a GPU, eager on a CPU)")
    parser.add_argument("--pipe-parallel-size", type=int, default=1,
                        help="1: our model as a one-stage DeepSpeed PipelineModule (GPT-NeoX's "
                             "default); 0: as a plain module")
    parser.add_argument("--reference-allocator", choices=["default", "framework"],
                        default="default",
                        help="on a CPU: the reference with glibc's defaults, as a plain script "
                             "runs (default), or with the host-memory setting our workers make "
                             "(megatron/training/host_memory.py), to separate that gain")
    parser.add_argument("--reference-limit", type=float, default=30.0, metavar="MINUTES",
                        help="skip the reference where its steps would take longer than this "
                             "at the matmul peak measured for its dtype (default: 30)")
    opts = parser.parse_args(argv)
    if opts.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {opts.rounds}")
    import torch

    from megatron.model.config import model_config_from_args
    from megatron.training.flops import flops_per_token

    if "fp16" in opts.dtypes and not torch.cuda.is_available():
        parser.error("--dtypes fp16 needs a CUDA GPU: DeepSpeed's fp16 does not run on a CPU")

    opts.reference = opts.reference or ("compiled" if torch.cuda.is_available() else "eager")
    peaks = {dtype: matmul_peak(dtype) for dtype in ("bfloat16", "float32")}
    if "fp16" in opts.dtypes:
        peaks["float16"] = matmul_peak("float16")
    peak = max(peaks.values())
    print(f"device: {device()} ({torch.get_num_threads()} threads); matmul peak bf16 "
          f"{flop_rate(peaks['bfloat16'])}, fp32 {flop_rate(peaks['float32'])} "
          + (f", fp16 {flop_rate(peaks['float16'])}" if "float16" in peaks else "") +
          f" (measured; MFU against the highest); reference " + {
              "compiled": "torch.compile of each layer + fused AdamW",
              "compiled-whole": "torch.compile of the model + fused AdamW",
              "eager": "eager + AdamW"}[opts.reference])
    print(f"{'size':>5} {'dtype':>5} {'fusions':>7} {'params':>9} {'seq':>5} {'micro':>5} | "
          f"{'ours ms':>9} {'ours tok/s':>10} | {'HF ms':>9} {'HF tok/s':>10} | "
          f"{'ours/HF':>7} | {'MFU':>6}")
    for size in opts.sizes:
        _, seq, micro = SIZES[size]
        seq, micro = opts.seq or seq, opts.micro or micro
        for dtype in opts.dtypes:
            args = neox_args(size, dtype, seq, micro, opts.pipe_parallel_size, opts.fusions[0])
            vocab = 50304 if size != "tiny" else 8192
            # the reference multiplies in its own dtype (autocast): where that is hopelessly
            # slow (bf16 on a CPU without bf16 instructions), it is not run
            flops = flops_per_token(model_config_from_args(args, vocab)) * micro * seq
            reference_peak = peaks[{"bf16": "bfloat16", "fp16": "float16"}.get(dtype, "float32")]
            reference_minutes = flops * (opts.warmup + opts.steps) / reference_peak / 60
            ratios: dict[str, list[tuple[float, float]]] = {f: [] for f in opts.fusions}
            for round_ in range(1, opts.rounds + 1):
                if opts.rounds > 1:
                    print(f"      round {round_} of {opts.rounds}:", flush=True)
                pairs = one_round(opts, args, size, dtype, seq, micro, vocab, peak,
                                  reference_minutes, reference_peak)
                for fusions, pair in pairs.items():
                    ratios[fusions].append(pair)
            if opts.rounds > 1:
                for fusions, pairs in ratios.items():
                    print(rounds_line(size, dtype, fusions, pairs), flush=True)
    return 0


def one_round(opts, args, size, dtype, seq, micro, vocab, peak, reference_minutes,
              reference_peak) -> dict[str, tuple[float, float]]:
    """Our runs (one per fusion choice) then the reference's, each in a fresh process, printed
    as they finish; fusion choice -> (our seconds, the reference's), for those the reference ran
    beside."""
    runs = []
    for fusions in opts.fusions:  # each of our runs is reported as soon as it is done
        runs.append(in_fresh_process("ours", opts, size, dtype, seq, micro, fusions))
        print(row(size, dtype, fusions, seq, micro, runs[-1], None, peak), flush=True)
        notes(opts, args, vocab, runs[-1])
    theirs = None
    if reference_minutes <= opts.reference_limit:
        theirs = in_fresh_process("hf", opts, size, dtype, seq, micro, opts.fusions[0])
        graphs = theirs["graphs"]
        print("      with the reference" + (f" ({graphs} graph(s) compiled)"
                                            if graphs else "") + ":", flush=True)
        for fusions, mine in zip(opts.fusions, runs):
            print(row(size, dtype, fusions, seq, micro, mine, theirs, peak), flush=True)
            if device().type == "cpu":
                print(f"      page faults per timed step: ours {mine['faults']:,.0f}, "
                      f"reference {theirs['faults']:,.0f} (reference allocator: "
                      f"{opts.reference_allocator})", flush=True)
    if theirs is None:
        print(f"      reference not run: its {dtype} products at the {dtype} matmul peak "
              f"measured here ({flop_rate(reference_peak)}) need about "
              f"{reference_minutes:,.0f} min for {opts.warmup + opts.steps} step"
              f"{'s' if opts.warmup + opts.steps != 1 else ''}, over "
              f"--reference-limit {opts.reference_limit:g}", flush=True)
        return {}
    return {fusions: (mine["seconds"], theirs["seconds"])
            for fusions, mine in zip(opts.fusions, runs)}


def rounds_line(size: str, dtype: str, fusions: str, pairs: list[tuple[float, float]]) -> str:
    """The rounds summed up: each round's ratio pairs our run with the reference run right
    after it, so a slow spell of the machine moves both sides of a ratio alike."""
    if not pairs:
        return f"      {size} {dtype} {fusions}: no reference ran, no ratio"
    ratios = sorted(ref / ours for ours, ref in pairs)
    ours_ms = sorted(ours * 1e3 for ours, _ in pairs)
    ref_ms = sorted(ref * 1e3 for _, ref in pairs)
    return (f"      {size} {dtype} {fusions} over {len(pairs)} rounds: ours/HF median "
            f"{statistics.median(ratios):.2f}x (lowest {ratios[0]:.2f}x, highest "
            f"{ratios[-1]:.2f}x); ours {statistics.median(ours_ms):.1f} ms "
            f"({ours_ms[0]:.1f}-{ours_ms[-1]:.1f}), reference {statistics.median(ref_ms):.1f} ms "
            f"({ref_ms[0]:.1f}-{ref_ms[-1]:.1f})")


def row(size, dtype, fusions, seq, micro, mine, theirs, peak) -> str:
    """One table row: our step beside the reference's, and our MFU."""
    from megatron.training.flops import count_parameters, flops_per_token

    tokens = micro * seq
    config, ours = mine["config"], mine["seconds"]
    mfu = flops_per_token(config) * tokens / ours / peak
    if theirs is None:
        reference = f"{'-':>9} {'-':>10} | {'-':>7}"
    else:
        ref = theirs["seconds"]
        reference = f"{ref * 1e3:>9.1f} {tokens / ref:>10,.0f} | {ref / ours:>6.2f}x"
    return (f"{size:>5} {dtype:>5} {fusions:>7} {count_parameters(config) / 1e6:>8.1f}M {seq:>5} "
            f"{micro:>5} | {ours * 1e3:>9.1f} {tokens / ours:>10,.0f} | {reference} | {mfu:>6.1%}")


def notes(opts, args, vocab, mine):
    """The lines under one of our rows: where the step went, memory, the profile."""
    from megatron.training.memory_estimate import GIB, training_estimate

    print(f"      {mine['phases']}" + (f"; {mine['graphs']} graph(s) compiled"
                                         if mine.get("graphs") else ""), flush=True)
    kind = device().type
    estimate = training_estimate(args, vocab, device=kind)
    measured = "peak allocated" if kind == "cuda" else "peak resident memory"
    print(f"      {measured} {mine['allocated']:.2f} GiB; estimate {estimate.total / GIB:.2f}"
          f" GiB (framework {estimate.term('framework') / GIB:.2f} of it)", flush=True)
    if mine.get("profile"):
        print(mine["profile"], flush=True)


if __name__ == "__main__":
    sys.exit(main())
