"""Mixture-of-experts feed-forward layer: routing, dropless expert computation, router losses.

Routing follows GPT-NeoX's two routers (`moe_router_type`):
- `sinkhorn`: router logits x W^T (no bias). In training the experts are the top k of the
  Sinkhorn-balanced exp(logits) (three balancing iterations, no gradient); the combination
  weights are the router's activation at those experts: sigmoid for k = 1, softmax otherwise.
  At inference the experts are the top k of that activation itself.
- `topk`: the top k of softmax(logits); with `normalize` (Mixtral's rule) the k weights are
  rescaled to sum to 1, without it (GPT-NeoX's) they are the raw probabilities.
`moe_jitter_eps` multiplies the router's input by uniform noise in [1 - eps, 1 + eps] during
training, as GPT-NeoX's top-k router does.

Dropless: every (token, expert) assignment is computed; nothing is capped by a capacity factor.
Assignments are sorted by expert, each expert runs one matrix product over its tokens, and the
outputs, scaled by the weights, are added back to their tokens.

Auxiliary losses (their coefficients are applied by the caller): the Switch Transformer
load-balancing loss, num_experts * sum_e (fraction of assignments to e) * (mean router
probability of e), as Hugging Face's Mixtral computes it; and the ST-MoE router z-loss,
mean(logsumexp(logits)^2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.activations import GATED, get_activation

ROUTERS = ("sinkhorn", "topk")


def sinkhorn(cost: torch.Tensor, tol: float = 1e-4, max_iter: int = 3) -> torch.Tensor:
    """GPT-NeoX's Sinkhorn balancing of exp(cost) [tokens, experts]: alternately rescale rows
    and columns (at most `max_iter` times, fewer once the column scales move less than `tol`)."""
    cost = torch.exp(cost)
    rows = torch.ones(cost.shape[0], device=cost.device, dtype=cost.dtype)
    cols = 1 / (cost.shape[1] * cost.sum(0))
    eps = 1e-8
    for _ in range(max_iter):
        rows = (1 / rows.shape[0]) / ((cols * cost).sum(1) + eps)
        new_cols = (1 / cols.shape[0]) / ((rows.unsqueeze(1) * cost).sum(0) + eps)
        moved = (cols - new_cols).abs().mean()
        cols = new_cols
        if moved < tol:
            break
    return cols * cost * rows.unsqueeze(1)


@dataclass(frozen=True)
class Routing:
    """Where each token goes: `experts` [T, k] ids, `weights` [T, k] combination weights, and
    the router `logits` [T, E] the auxiliary losses read."""

    weights: torch.Tensor
    experts: torch.Tensor
    logits: torch.Tensor


class Router(nn.Module):
    """Token -> top-k experts and their weights (see the module docstring for the kinds)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, kind: str = "sinkhorn",
                 jitter_eps: float | None = None, normalize: bool = False):
        super().__init__()
        if kind not in ROUTERS:
            raise ValueError(f"moe_router_type {kind!r} is not known; valid: {', '.join(ROUTERS)}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe_top_k {top_k} must be between 1 and moe_num_experts "
                             f"{num_experts}")
        self.kind, self.top_k, self.jitter_eps, self.normalize = kind, top_k, jitter_eps, normalize
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> Routing:
        # x: [T, h]
        if self.training and self.jitter_eps:
            low, high = 1.0 - self.jitter_eps, 1.0 + self.jitter_eps
            x = x * (low + torch.rand_like(x) * (high - low))
        logits = F.linear(x, self.weight)  # [T, E]
        if self.kind == "sinkhorn":
            act = (torch.sigmoid(logits) if self.top_k == 1
                   else torch.softmax(logits.float(), dim=-1).type_as(logits))
            if self.training:
                with torch.no_grad():
                    experts = torch.topk(sinkhorn(logits.float()), self.top_k, dim=1).indices
                weights = act.gather(1, experts)
            else:
                weights, experts = torch.topk(act, self.top_k, dim=1)
        else:
            weights, experts = torch.topk(logits.softmax(dim=-1), self.top_k, dim=-1)
            if self.normalize:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(weights, experts, logits)


class Experts(nn.Module):
    """`num_experts` feed-forward networks h -> f -> h. `w_in` [E, f (2f for gated
    activations: value rows, then gate rows), h]; `w_out` [E, h, f]; no biases (GPT-NeoX's
    experts have none)."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, activation: str,
                 init_std: float = 0.02, out_std: float | None = None):
        super().__init__()
        up = 2 * ffn if activation in GATED else ffn
        self.activation = get_activation(activation)
        self.w_in = nn.Parameter(torch.empty(num_experts, up, hidden))
        self.w_out = nn.Parameter(torch.empty(num_experts, hidden, ffn))
        nn.init.normal_(self.w_in, std=init_std)
        nn.init.normal_(self.w_out, std=init_std if out_std is None else out_std)

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # x: [N, h], rows grouped by expert, counts[e] rows for expert e -> [N, h]
        outputs = []
        for e, rows in enumerate(x.split(counts)):
            if rows.shape[0]:
                outputs.append(F.linear(self.activation(F.linear(rows, self.w_in[e])),
                                        self.w_out[e]))
        return torch.cat(outputs) if outputs else x.new_zeros(0, x.shape[-1])


@dataclass(frozen=True)
class MoEStats:
    """One MoE layer's step: assignments per expert [E], and the two auxiliary losses."""

    load: torch.Tensor
    balance_loss: torch.Tensor
    z_loss: torch.Tensor


def load_balancing_loss(logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """num_experts * sum_e (assignments to e / tokens) * (mean softmax probability of e)."""
    num_experts = logits.shape[-1]
    probs = torch.softmax(logits.float(), dim=-1)  # [T, E]
    share = torch.bincount(experts.reshape(-1), minlength=num_experts).float() / logits.shape[0]
    return num_experts * (share * probs.mean(0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """mean over tokens of logsumexp(logits)^2 (ST-MoE), which keeps router logits small."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


class DroplessMoE(nn.Module):
    """Router plus experts: every token's output is the weighted sum of its k experts' outputs."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, top_k: int, activation: str,
                 router: str = "sinkhorn", jitter_eps: float | None = None,
                 normalize: bool = False):
        super().__init__()
        self.num_experts = num_experts
        self.router = Router(hidden, num_experts, top_k, router, jitter_eps, normalize)
        self.experts = Experts(hidden, ffn, num_experts, activation)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, MoEStats]:
        # x: [b, s, h] -> [b, s, h]
        flat = x.reshape(-1, x.shape[-1])  # [T, h]
        routing = self.router(flat)
        k = routing.experts.shape[1]
        expert_of = routing.experts.reshape(-1)  # [T k]
        order = torch.argsort(expert_of, stable=True)  # assignments grouped by expert
        token_of = order // k
        load = torch.bincount(expert_of, minlength=self.num_experts)
        out = self.experts(flat[token_of], load.tolist())  # [T k, h]
        out = out * routing.weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        combined = torch.zeros_like(flat).index_add_(0, token_of, out.to(flat.dtype))
        stats = MoEStats(load, load_balancing_loss(routing.logits, routing.experts),
                         router_z_loss(routing.logits))
        return combined.view_as(x), stats
