"""Autoregressive generation for batches of prompts of different lengths, KV cache or recompute.

    outs = generate(model, prompts, max_new_tokens=32, params=SamplingParams(),
                    stop_ids=frozenset({eod}), batch_size=8)

Prompts are sorted by length (longest first, so a batch that does not fit fails first), cut into
batches, left-padded to the longest prompt of their batch and decoded together:

    row 0:  pad pad  p0  p1 | g0 g1 ...      positions  0 0 0 1 | 2 3 ...
    row 1:   q0  q1  q2  q3 | g0 g1 ...      positions  0 1 2 3 | 4 5 ...

Padding is masked out of attention (the KV cache's key_padding, or a [b, 1, s, s] mask when
recomputing) and out of Mamba layers' states, so a prompt gives the same tokens alone or in a
batch. With the cache the prompt
is run once and each step feeds one token; `use_cache=False` reruns the whole sequence each step.
A row stops at a stop id (EOD always is one), when `text_stop` says so, or after max_new_tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from megatron.monitoring.progress import progress
from megatron.text_generation.checks import check_kv_cache_fits
from megatron.text_generation.prompts import check_lengths
from megatron.text_generation.inference_model import InferenceModel
from megatron.text_generation.sampling import SamplingParams, sample

TextStop = Callable[[list[int]], bool]  # generated ids of one row -> stop now?


@dataclass
class Generated:
    """One prompt's result: generated ids (ending with the stop id when one ended it), why it
    ended ("stop_token", "stop_string" or "length"), and its batch's wall time."""

    prompt_ids: list[int]
    ids: list[int]
    stop_reason: str
    seconds: float = 0.0
    batch_size: int = 1


def padded_causal_mask(real: torch.Tensor) -> torch.Tensor:
    """keep-mask [b, 1, s, s] for left-padded rows: causal, real keys only; a padding query
    keeps its own key so that no row of the softmax is empty."""
    s = real.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=real.device).tril()  # [s, s]
    keep = causal & real[:, None, None, :]  # [b, 1, s, s]
    return keep | torch.eye(s, dtype=torch.bool, device=real.device)


def _left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    """tokens, positions [b, L] and real-token flags [b, L] for left-padded prompts."""
    b, longest = len(prompts), max(len(p) for p in prompts)
    tokens = torch.full((b, longest), pad_id, dtype=torch.long)
    positions = torch.zeros(b, longest, dtype=torch.long)
    real = torch.zeros(b, longest, dtype=torch.bool)
    for i, p in enumerate(prompts):
        start = longest - len(p)
        tokens[i, start:] = torch.tensor(p, dtype=torch.long)
        positions[i, start:] = torch.arange(len(p))
        real[i, start:] = True
    return tokens.to(device), positions.to(device), real.to(device)


class _Decoder:
    """Feeds tokens to the model and returns the next-token logits [b, V] (fp32, gathered)."""

    def __init__(self, model: InferenceModel, tokens, positions, real, max_new: int,
                 use_cache: bool):
        self.model, self.use_cache = model, use_cache
        b, longest = tokens.shape
        padded = not bool(real.all())
        if use_cache:
            attention_layers = sum(not model.config.is_mamba_layer(i)
                                   for i in range(model.config.num_layers))
            check_kv_cache_fits(attention_layers, b, longest + max_new,
                                model.config.num_kv_heads // model.tp.size,
                                model.config.head_dim, model.dtype, model.device)
            keep = None
            if padded:
                keep = torch.ones(b, longest + max_new, dtype=torch.bool, device=real.device)
                keep[:, :longest] = real
            self.cache = model.new_cache(b, longest + max_new, keep)
        self.tokens, self.positions, self.real = tokens, positions, real
        self.padded = padded

    def first(self) -> torch.Tensor:
        if self.use_cache:
            local = self.model.forward(self.tokens, self.positions, kv_cache=self.cache)
        else:
            local = self._recompute()
        return self.model.gather_vocab(local[:, -1])  # [b, V]

    def _recompute(self) -> torch.Tensor:
        """The model over every token so far. Mamba layers read left padding from a cache's
        key-padding mask (attention layers from the [b, 1, s, s] mask): with them, a padded
        batch runs through a fresh cache, so nothing is reused from the previous step."""
        if not self.padded:
            return self.model.forward(self.tokens, self.positions)
        if self.model.config.has_mamba:
            fresh = self.model.new_cache(*self.tokens.shape, key_padding=self.real)
            return self.model.forward(self.tokens, self.positions, kv_cache=fresh)
        return self.model.forward(self.tokens, self.positions, padded_causal_mask(self.real))

    def next(self, new_tokens: torch.Tensor, new_positions: torch.Tensor) -> torch.Tensor:
        """new_tokens, new_positions [b] -> logits [b, V] for the token after them."""
        if self.use_cache:
            local = self.model.forward(new_tokens[:, None], new_positions[:, None],
                                       kv_cache=self.cache)
            return self.model.gather_vocab(local[:, -1])
        self.tokens = torch.cat([self.tokens, new_tokens[:, None]], dim=1)
        self.positions = torch.cat([self.positions, new_positions[:, None]], dim=1)
        self.real = torch.cat([self.real, torch.ones_like(self.real[:, :1])], dim=1)
        return self.model.gather_vocab(self._recompute()[:, -1])


def generate_batch(model: InferenceModel, prompts: list[list[int]], max_new_tokens: int,
                   params: SamplingParams, stop_ids: frozenset[int],
                   generators: list[torch.Generator] | None = None, use_cache: bool = True,
                   text_stop: TextStop | None = None, pad_id: int = 0) -> list[Generated]:
    """Decode one batch (every prompt non-empty) under torch.inference_mode()."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (use EOD for an empty prompt)")
    with torch.inference_mode():
        tokens, positions, real = _left_pad(prompts, pad_id, model.device)
        decoder = _Decoder(model, tokens, positions, real, max_new_tokens, use_cache)
        next_pos = torch.tensor([len(p) for p in prompts], device=model.device)
        out = [Generated(list(p), [], "length") for p in prompts]
        done = [False] * len(prompts)
        logits = decoder.first()
        for step in range(max_new_tokens):
            logits[:, model.token_limit:] = float("-inf")
            chosen = model.agree(sample(logits, params, generators))  # [b]
            for i, token in enumerate(chosen.tolist()):
                if done[i]:
                    continue
                out[i].ids.append(token)
                if token in stop_ids:
                    done[i], out[i].stop_reason = True, "stop_token"
                elif text_stop is not None and text_stop(out[i].ids):
                    done[i], out[i].stop_reason = True, "stop_string"
            if all(done) or step == max_new_tokens - 1:
                break
            chosen = chosen.masked_fill(torch.tensor(done, device=chosen.device), pad_id)
            logits = decoder.next(chosen, next_pos)
            next_pos = next_pos + 1
    return out


def generate(model: InferenceModel, prompts: list[list[int]], max_new_tokens: int,
             params: SamplingParams, stop_ids: frozenset[int], batch_size: int = 8,
             generators: list[torch.Generator] | None = None, use_cache: bool = True,
             text_stop: TextStop | None = None, pad_id: int = 0) -> list[Generated]:
    """Every prompt's result, in prompt order; batches of similar length (A14 checked first).

    `generators` (one per prompt) make sampling reproducible per prompt."""
    if batch_size < 1:
        raise ValueError(f"generation_batch_size({batch_size}) must be at least 1")
    check_lengths([len(p) for p in prompts], max_new_tokens, model.max_positions)
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    results: list[Generated | None] = [None] * len(prompts)
    starts = range(0, len(order), batch_size)
    if len(starts) > 1:  # one batch (an interactive prompt) needs no bar
        starts = progress(starts, desc="generating", unit="batch")
    for start in starts:
        rows = order[start:start + batch_size]
        gens = None if generators is None else [generators[i] for i in rows]
        began = time.perf_counter()
        batch = generate_batch(model, [prompts[i] for i in rows], max_new_tokens, params,
                               stop_ids, gens, use_cache, text_stop, pad_id)
        seconds = time.perf_counter() - began
        for i, g in zip(rows, batch):
            g.seconds, g.batch_size = seconds, len(rows)
            results[i] = g
    return results  # type: ignore[return-value]


def stop_string_checker(stop_strings: tuple[str, ...], detokenize) -> TextStop | None:
    """A `text_stop` that ends a row once its text contains one of `stop_strings`."""
    if not stop_strings:
        return None
    longest = max(len(s) for s in stop_strings)

    def stop(ids: list[int]) -> bool:
        # only the tail can hold a new match: enough tokens for the longest string (+ slack)
        tail = detokenize(ids[-(longest + 8):])
        return any(s in tail for s in stop_strings)

    return stop


REPLACEMENT = "\ufffd"  # what decoding puts for bytes that are not (yet) a whole character


def sample_text(detokenize, g: Generated, stop_strings: tuple[str, ...]) -> str:
    """A sample's text: its ids without the stop id, decoded, cut before any stop string. When
    maximum_tokens ends a sample inside a character (byte-level tokenizers give a character of
    several UTF-8 bytes tokens of their own), its first bytes decode to one U+FFFD, which is left
    out: the text ends at the last whole character (`ids` keep every token)."""
    body = g.ids[:-1] if g.stop_reason == "stop_token" else g.ids
    text = cut_at_stop(detokenize(body), stop_strings)
    if g.stop_reason == "length" and text.endswith(REPLACEMENT):
        text = text[:-1]
    return text


def cut_at_stop(text: str, stop_strings: tuple[str, ...]) -> str:
    """`text` up to the first occurrence of any stop string."""
    cut = len(text)
    for s in stop_strings:
        at = text.find(s)
        if at != -1:
            cut = min(cut, at)
    return text[:cut]
