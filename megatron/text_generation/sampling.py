"""Choosing the next token: a pure function from logits (and random generators) to token ids.

    ids = sample(logits, SamplingParams(temperature=0.8, top_k=40, top_p=0.95), generators)

Temperature, top_k and top_p all 0 is greedy (argmax, no randomness). Otherwise the logits are
divided by the temperature (when it is above 0: temperature 0 with top_k or top_p leaves them
as they are, as in GPT-NeoX), cut to the top_k most likely tokens and to the smallest set whose
probability reaches top_p, and one token per row is drawn from that row's own
`torch.Generator`: a row's sample depends only on its logits and its generator, never on the
other rows of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens: temperature (0 = unscaled, and greedy with top_k and top_p off),
    top_k (0 = off), top_p (0 = off)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature({self.temperature}) must be at least 0")
        if self.top_k < 0:
            raise ValueError(f"top_k({self.top_k}) must be at least 0")
        if not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p({self.top_p}) must be in [0, 1]")

    @property
    def greedy(self) -> bool:
        """GPT-NeoX's rule: argmax only when nothing asks for sampling."""
        return self.temperature == 0.0 and self.top_k == 0 and self.top_p == 0.0


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [b, V] -> fp32 logits [b, V] scaled by 1/temperature (temperature 0: unscaled)
    with every token outside top_k / top_p set to -inf (the most likely token always stays)."""
    out = logits.float()
    if params.temperature > 0.0:
        out = out / params.temperature
    vocab = out.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(out, params.top_k, dim=-1).values[..., -1:]  # [b, 1]
        out = out.masked_fill(out < kth, float("-inf"))
    if 0.0 < params.top_p < 1.0:
        sorted_logits, order = torch.sort(out, dim=-1, descending=True)  # [b, V]
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample(logits: torch.Tensor, params: SamplingParams,
           generators: list[torch.Generator] | None = None) -> torch.Tensor:
    """Token ids [b] (int64) for logits [b, V]; `generators` has one generator per row
    (None: torch's global generator). Greedy ignores the generators."""
    if logits.dim() != 2:
        raise ValueError(f"sample expects logits [batch, vocab], got {tuple(logits.shape)}")
    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, params).softmax(dim=-1)  # [b, V]
    if generators is None:
        return torch.multinomial(probs, 1).squeeze(-1)
    if len(generators) != probs.shape[0]:
        raise ValueError(f"{len(generators)} generators for a batch of {probs.shape[0]} rows")
    rows = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]
    return torch.cat(rows)


def seeded_generators(seed: int, sample_indices: list[int], device: torch.device | str = "cpu"
                      ) -> list[torch.Generator]:
    """One generator per sample, seeded from (seed, the sample's index in the run), so sample i
    is the same whatever batch or replica it lands in."""
    out = []
    for index in sample_indices:
        g = torch.Generator(device=device)
        g.manual_seed((seed * 1_000_003 + index) % (2**63))
        out.append(g)
    return out
