"""Our cross entropy (megatron/model/fusions.cross_entropy: the Triton kernels on a GPU, the
blocked torch ops of megatron/mpu/cross_entropy.py on a CPU) against torch's
`cross_entropy(logits.float())`: forward + backward time and peak memory, same logits, measured
in the same run.

    python bench/cross_entropy.py                         # 2048 tokens x 50304, bf16 and fp32
    python bench/cross_entropy.py --tokens 8192 --dtypes bf16

Each variant runs in its own fresh process, so its peak resident memory (CPU) or peak allocated
memory (CUDA) is its own; the figure is the growth of one step beyond the logits themselves
(the gradient of the logits included).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _variant(variant: str, dtype_name: str, tokens: int, vocab: int, repeats: int, out) -> None:
    """In a fresh process: the logits, then one step whose memory growth is the peak (resident
    memory on CPU, allocated on CUDA), then `repeats` timed steps; puts (median s, peak bytes)."""
    import torch
    import torch.nn.functional as F

    from megatron.model.fusions import cross_entropy
    from megatron.mpu.groups import NO_TP

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(tokens, vocab, device=device, generator=g, dtype=getattr(torch, dtype_name))
    logits.requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=g)

    def used() -> int:
        if cuda:
            return torch.cuda.max_memory_allocated()
        from megatron.monitoring.memory_profile import peak_rss_bytes

        return peak_rss_bytes()

    def step():
        if variant == "ours":
            loss = cross_entropy(logits, labels, NO_TP).mean()
        else:
            loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        logits.grad = None
        if cuda:
            torch.cuda.synchronize()

    before = used()
    step()
    peak = used() - before
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    out.put((statistics.median(times), peak))


def run(variant: str, dtype: str, tokens: int, vocab: int, repeats: int) -> tuple[float, int]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_variant, args=(variant, dtype, tokens, vocab, repeats, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args(argv)
    logits_gib = opts.tokens * opts.vocab / 2**30
    print(f"{opts.tokens} tokens x {opts.vocab} vocabulary; forward + backward of the mean loss")
    print(f"{'dtype':>9} | {'torch ms':>9} {'peak GiB':>9} | {'ours ms':>10} {'peak GiB':>9} |"
          f" {'speed':>6} {'memory':>7}")
    for dtype in opts.dtypes:
        t_ref, m_ref = run("torch", dtype, opts.tokens, opts.vocab, opts.repeats)
        t_new, m_new = run("ours", dtype, opts.tokens, opts.vocab, opts.repeats)
        print(f"{dtype:>9} | {t_ref * 1e3:>9.1f} {m_ref / 2**30:>9.2f} | {t_new * 1e3:>10.1f} "
              f"{m_new / 2**30:>9.2f} | {t_ref / t_new:>5.2f}x {m_new / max(m_ref, 1):>6.2f}x",
              flush=True)
    print(f"(the logits themselves: {logits_gib * 2:.2f} GiB in bf16, {logits_gib * 4:.2f} GiB in "
          "fp32; peak is the growth beyond them)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
