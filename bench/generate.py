"""Generation and eval throughput of the tiny model: KV cache vs recompute vs Hugging Face.

    .venv/bin/python bench/generate.py                     # configs/tiny.yml shape, random weights
    .venv/bin/python bench/generate.py --new-tokens 64 --prompt-tokens 32 --repeats 3

Prints one table: greedy generation tokens/s (generated tokens only, prompt included in the
time) for our model with the KV cache, with recompute, and for Hugging Face's
`GPTNeoXForCausalLM.generate` (its KV cache) on the same weights, at batch 1 and batch 8; and
lm-eval loglikelihood requests/s through the adapter. Every figure is the best of --repeats
runs; the three generation runs take turns, so a busy machine slows them alike.
Random weights: no stop token is used, so every run generates exactly --new-tokens tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from megatron.model.config import ModelConfig  # noqa: E402
from megatron.model.gpt import GPTModel  # noqa: E402
from megatron.model.hf_mapping import to_hf_model  # noqa: E402
from megatron.model.partition import canonical_from_module  # noqa: E402
from megatron.text_generation.generation import generate  # noqa: E402
from megatron.text_generation.inference_model import InferenceModel  # noqa: E402
from megatron.text_generation.sampling import SamplingParams  # noqa: E402


def tiny_config() -> ModelConfig:
    """configs/tiny.yml's model with a 2048-token vocabulary (the built-in tokenizer's)."""
    return ModelConfig(num_layers=4, hidden_size=128, num_attention_heads=4, num_kv_heads=4,
                       intermediate_size=512, seq_length=128, max_position_embeddings=128,
                       padded_vocab_size=2048, rotary_pct=0.25)


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def interleaved_best(repeats: int, runs: dict) -> dict:
    """Best wall time of each run, the runs taken in turn each round (so that a busy machine
    slows all of them alike)."""
    best = {name: float("inf") for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            began = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def generation_rows(model, hf, batch: int, prompt_len: int, new: int, repeats: int):
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(2, 2048, (batch, prompt_len), generator=g)
    as_lists = prompts.tolist()
    params = SamplingParams()

    def ours(use_cache: bool):
        out = generate(model, as_lists, new, params, frozenset(), batch_size=batch,
                       use_cache=use_cache)
        assert all(len(o.ids) == new for o in out)

    def theirs():
        with torch.inference_mode():
            out = hf.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                              max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        assert out.shape[1] == prompt_len + new

    runs = {f"ours, KV cache, batch {batch}": lambda: ours(True),
            f"ours, recompute, batch {batch}": lambda: ours(False),
            f"HF generate, batch {batch}": theirs}
    for fn in runs.values():  # warm-up
        fn()
    best = interleaved_best(repeats, runs)
    return [(name, batch * new / seconds) for name, seconds in best.items()]


def loglikelihood_rate(model, requests: int, batch: int, repeats: int) -> float:
    from lm_eval.api.instance import Instance

    from megatron.evaluation.adapter import NeoXLM

    class Ids:  # a tokenizer over space-separated ids, so no vocabulary file is needed
        eod, pad, vocab_size, max_token_id = 0, 0, 2048, 2047

        def tokenize(self, text):
            return [int(t) for t in text.split()]

        def detokenize(self, ids):
            return " ".join(map(str, ids))

    g = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(requests):
        ctx = " ".join(map(str, torch.randint(2, 2048, (40 + i % 40,), generator=g).tolist()))
        cont = " " + " ".join(map(str, torch.randint(2, 2048, (5,), generator=g).tolist()))
        reqs.append(Instance("loglikelihood", {}, (ctx, cont), i))
    lm = NeoXLM(model, Ids(), batch_size=batch)
    lm.loglikelihood(reqs[:batch])  # warm-up
    return requests / best_of(repeats, lambda: lm.loglikelihood(reqs))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = parser.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    config = tiny_config()
    module = GPTModel(config).eval()
    canonical = canonical_from_module(module.state_dict())
    model = InferenceModel.from_canonical(config, canonical)
    hf = to_hf_model(canonical, config)
    rows = []
    for batch in (1, 8):
        rows += generation_rows(model, hf, batch, a.prompt_tokens, a.new_tokens, a.repeats)
    print(f"tiny model ({config.num_layers} layers x {config.hidden_size}), CPU, "
          f"{torch.get_num_threads()} threads, prompt {a.prompt_tokens} + {a.new_tokens} new "
          f"tokens, greedy, best of {a.repeats}")
    print(f"{'run':<32} {'tokens/s':>10} {'vs HF':>7}")
    for i, (name, rate) in enumerate(rows):
        hf_rate = rows[i - i % 3 + 2][1]
        print(f"{name:<32} {rate:>10.1f} {rate / hf_rate:>6.2f}x")
    for batch in (1, 8):
        rate = loglikelihood_rate(model, a.requests, batch, a.repeats)
        print(f"{f'lm-eval loglikelihood, batch {batch}':<32} {rate:>10.1f} requests/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
