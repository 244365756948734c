"""Log-likelihoods of windows of tokens: batched, sorted by length, vocab-parallel, in fp32.

    results = score_windows(model, windows, batch_size=8)   # [(sum of log-probs, all greedy)]

Log-probs are computed from this rank's vocabulary slice of the logits without gathering the
full vocabulary (a max, the target's logit and the sum of exponentials are reduced over the
tensor-parallel group), in float32, and checked for dtype, shape and finiteness (A27). Windows
run longest first, so a batch too big for memory fails at once; on a CUDA out-of-memory error
the batch is halved and retried (A26; with tensor parallelism a failed rank cannot be retried
alone, so the error is raised with advice instead).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megatron.evaluation.windows import Window
from megatron.monitoring.logger import get_logger
from megatron.monitoring.progress import progress

log = get_logger(__name__)


def token_logprobs(local_logits: torch.Tensor, targets: torch.Tensor, tp, vocab_start: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target) [b, s] fp32, target is the argmax [b, s]) from this rank's logits slice
    [b, s, V/tp] whose first column is vocabulary id `vocab_start`."""
    x = local_logits.float()
    per_rank = x.shape[-1]
    top = x.max(dim=-1).values  # [b, s]
    inside = (targets >= vocab_start) & (targets < vocab_start + per_rank)
    local = (targets - vocab_start).clamp(0, per_rank - 1)
    picked = x.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
    if tp.enabled:
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=tp.group)
        dist.all_reduce(picked, group=tp.group)
    sum_exp = (x - top.unsqueeze(-1)).exp().sum(dim=-1)
    if tp.enabled:
        dist.all_reduce(sum_exp, group=tp.group)
    return picked - top - sum_exp.log(), picked >= top


def check_logprobs(logprobs: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    """A27: float32, the expected shape, every value finite."""
    if logprobs.dtype != torch.float32:
        raise RuntimeError(f"{what}: log-probs are {logprobs.dtype}, expected torch.float32")
    if tuple(logprobs.shape) != tuple(shape):
        raise RuntimeError(f"{what}: log-probs have shape {tuple(logprobs.shape)}, expected "
                           f"{tuple(shape)}")
    bad = ~torch.isfinite(logprobs)
    if bool(bad.any()):
        raise RuntimeError(f"{what}: {int(bad.sum())} log-prob(s) are not finite (the model "
                           "produced inf/NaN logits); check the checkpoint and precision")


def _score_batch(model, batch: list[Window], pad_id: int) -> list[tuple[float, bool]]:
    longest = max(len(w.inputs) for w in batch)
    tokens = torch.full((len(batch), longest), pad_id, dtype=torch.long)
    targets = torch.zeros(len(batch), longest, dtype=torch.long)
    for i, w in enumerate(batch):  # right padding: a causal model ignores what comes after
        tokens[i, :len(w.inputs)] = torch.tensor(w.inputs)
        targets[i, :len(w.targets)] = torch.tensor(w.targets)
    positions = torch.arange(longest).expand(len(batch), longest)
    local = model.forward(tokens, positions)  # [b, s, V/tp]
    logp, greedy = token_logprobs(local, targets.to(local.device), model.tp, model.vocab_start)
    check_logprobs(logp, (len(batch), longest), "eval batch")
    out = []
    for i, w in enumerate(batch):
        n = len(w.inputs)
        span = slice(n - w.num_scored, n)
        out.append((float(logp[i, span].sum()), bool(greedy[i, span].all())))
    return out


def score_windows(model, windows: list[Window], batch_size: int, pad_id: int = 0
                  ) -> list[tuple[float, bool]]:
    """(sum of scored log-probs, every scored token greedy) per window, in input order."""
    if batch_size < 1:
        raise ValueError(f"eval_batch_size({batch_size}) must be at least 1")
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i].inputs))
    results: list = [None] * len(windows)
    start = 0
    with torch.inference_mode(), progress(total=len(order), desc="scoring", unit="window") as bar:
        while start < len(order):
            rows = order[start:start + batch_size]
            try:
                scored = _score_batch(model, [windows[i] for i in rows], pad_id)
            except torch.OutOfMemoryError:
                if batch_size == 1 or model.tp.enabled:
                    raise RuntimeError(
                        f"out of memory scoring a batch of {len(rows)} window(s) of up to "
                        f"{len(windows[rows[0]].inputs)} tokens; lower eval_batch_size"
                        + (" (no retry with model_parallel_size > 1)" if model.tp.enabled
                           else "")) from None
                batch_size //= 2
                log.warning("out of memory in eval: retrying with batch size %d", batch_size)
                continue
            for i, value in zip(rows, scored):
                results[i] = value
            start += len(rows)
            bar.update(len(rows))
    return results
