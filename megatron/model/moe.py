"""Mixture-of-experts feed-forward layer: routing, dropless expert computation, router losses.

Transformer layer i (0-based) has an `MoE` in place of its MLP when moe_num_experts > 1 and
i % moe_expert_interval == 0 (GPT-NeoX's rule). Routing follows GPT-NeoX's two routers
(`moe_router_type`):
- `sinkhorn`: router logits x W^T (no bias). In training the experts are the top k of the
  Sinkhorn-balanced exp(logits) (three balancing iterations, no gradient); the combination
  weights are the router's activation at those experts: sigmoid for k = 1, softmax otherwise.
  At inference the experts are the top k of that activation itself.
- `topk`: the top k of softmax(logits); with `moe_normalize_topk` (Mixtral's rule) the k weights
  are rescaled to sum to 1, without it (GPT-NeoX's) they are the raw probabilities.
`moe_jitter_eps` multiplies the router's input by uniform noise in [1 - eps, 1 + eps] during
training, as GPT-NeoX's top-k router does.

Dropless: every (token, expert) assignment is computed; nothing is capped by a capacity factor.
Assignments are sorted by expert, each expert runs its products over its tokens, and the
outputs, scaled by the weights, are added back to their tokens. Each expert is an MLP of the
dense MLP's width and activation, without biases (GPT-NeoX's experts have none): `w_in`
[E, f (2f for gated activations: value rows, then gate rows), h], `w_out` [E, h, f].

Tensor parallelism (GPT-NeoX splits experts over the model-parallel group): each of the tp
ranks holds E / tp whole experts and the router whole. Every rank routes the same tokens the
same way, runs its own experts on the tokens sent to them, and the partial outputs are summed
over the group, as a row-parallel linear's are. The experts' input and the combination weights
pass through `copy_to_tensor_parallel`, whose backward sums the partial gradients, so the
router and everything before the layer receive the full gradient on every rank.

Expert parallelism (moe_expert_parallel_size ep): a tensor rank's E / tp experts are split
further over ep data-parallel ranks, which route their own tokens and exchange the assignments
by all-to-all (moe_dispatch.py): each runs its E / (tp ep) experts on the tokens of all ep
ranks and sends the outputs back. The router is replicated like any weight; the experts'
gradients are averaged over the ranks holding the same experts
(megatron/training/expert_parallel.py).

Auxiliary losses: the Switch Transformer load-balancing loss, E * sum_e (fraction of
assignments to e) * (mean router probability of e), as Hugging Face's Mixtral computes it; and
the ST-MoE router z-loss, mean(logsumexp(logits)^2). GPT-NeoX trains on neither; here
`moe_aux_loss_coeff` and `moe_z_loss_coeff` (default 0) add them to the training loss. The sum
is attached to the layer's output (`AttachAuxLoss`): its gradient enters the router in the
backward, on whichever pipeline stage holds the layer and inside recomputed checkpoints, scaled
as the language-model loss is (1 / gradient accumulation steps, times the fp16 loss scale:
`aux_loss_scale`, set by the training step). Each layer keeps its load and losses over the
training forwards since they were last read (`take_stats`), for the log.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model.activations import get_activation
from megatron.model.config import GATED
from megatron.model.moe_dispatch import exchange_and_compute
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.mappings import copy_to_tensor_parallel, reduce_from_tensor_parallel
from megatron.mpu.products import linear

ROUTERS = ("sinkhorn", "topk")
_GRAD_SCALE = [1.0]  # the gradient scale of the training loss (see aux_loss_scale)


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


class Routing(NamedTuple):
    """Where each token goes: `experts` [T, k] ids, `weights` [T, k] combination weights, and
    the router `logits` [T, E] the auxiliary losses read. A tuple, so that ZeRO 3's module hooks
    see its tensors."""

    weights: torch.Tensor
    experts: torch.Tensor
    logits: torch.Tensor


class Router(nn.Module):
    """Token -> top-k experts and their weights (see the module docstring for the kinds)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, kind: str = "sinkhorn",
                 jitter_eps: float | None = None, normalize: bool = False, init_fn=None,
                 gen: torch.Generator | None = None):
        super().__init__()
        if kind not in ROUTERS:
            raise ValueError(f"moe_router_type {kind!r} is not known; valid: {', '.join(ROUTERS)}")
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"moe_top_k {top_k} must be between 1 and moe_num_experts "
                             f"{num_experts}")
        self.kind, self.top_k, self.jitter_eps, self.normalize = kind, top_k, jitter_eps, normalize
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        with torch.no_grad():  # GPT-NeoX initialises it with init_method
            if init_fn is None:
                self.weight.normal_(0.0, 0.02, generator=gen or torch.Generator().manual_seed(0))
            else:
                init_fn(self.weight, gen)

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
    """This rank's experts, numbers `first` .. `first + count - 1` of `num_experts`: MLPs
    h -> f -> h without biases. The full [E, ...] weights are drawn from `gen` and split along
    the expert dimension, over the tensor ranks and then over the expert-parallel ranks
    (`expert_block`), so a seed gives the same experts at any layout."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, activation: str, init_fn,
                 out_init_fn, gen: torch.Generator, tp: TensorParallel = NO_TP,
                 fp32_products: bool = False):
        super().__init__()
        self.fp32_products = fp32_products  # bf16/fp16 CPU products in fp32 (mpu/products.py)
        if num_experts % (tp.size * tp.ep.size):
            raise ValueError(f"moe_num_experts({num_experts}) is not divisible by "
                             f"model_parallel_size({tp.size}) * "
                             f"moe_expert_parallel_size({tp.ep.size})")
        up = 2 * ffn if activation in GATED else ffn
        self.activation = get_activation(activation)
        self.count = num_experts // (tp.size * tp.ep.size)
        self.first = expert_block(tp) * self.count
        # initialised as GPT-NeoX's grouped 2-D weights [E * rows, cols]
        w_in, w_out = torch.empty(num_experts * up, hidden), torch.empty(num_experts * hidden, ffn)
        init_fn(w_in, gen)
        out_init_fn(w_out, gen)
        self.w_in = nn.Parameter(local_experts(w_in.view(num_experts, up, hidden), tp))
        self.w_out = nn.Parameter(local_experts(w_out.view(num_experts, hidden, ffn), tp))
        if tp.enabled:
            self.w_in.tensor_model_parallel = self.w_out.tensor_model_parallel = True
        if tp.ep.enabled:
            for p in (self.w_in, self.w_out):
                p.expert_parallel = True  # differs over the expert-parallel group

    def forward(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        # x: [N, h], rows grouped by local expert, counts[e] rows for expert e -> [N, h]
        if grouped_gemm(x.device.type, x.dtype, *self.w_in.shape[1:], self.w_out.shape[2]):
            offsets = torch.tensor(counts, device=x.device).cumsum(0).to(torch.int32)
            up = _GroupedMM.apply(x, self.w_in.transpose(1, 2), offsets)  # [N, up]
            return _GroupedMM.apply(self.activation(up), self.w_out.transpose(1, 2), offsets)
        outputs = []
        for e, rows in enumerate(x.split(counts)):  # every expert, so every weight has a grad
            up = self.activation(linear(rows, self.w_in[e], fp32=self.fp32_products))
            outputs.append(linear(up, self.w_out[e], fp32=self.fp32_products))
        return torch.cat(outputs)


def expert_block(tp: TensorParallel) -> int:
    """Which of the tp * ep equal blocks of experts this rank holds: tensor rank t, expert rank
    q hold block t * ep + q, so the ep ranks of tensor rank t together hold what tensor rank t
    holds without expert parallelism (a checkpoint's tensor shards do not depend on ep)."""
    return tp.rank * tp.ep.size + tp.ep.rank


def local_experts(full: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This rank's block of a full [E, ...] expert tensor."""
    count = full.shape[0] // (tp.size * tp.ep.size)
    return full.narrow(0, expert_block(tp) * count, count).clone()


def describe(config, dtype: torch.dtype, device_type: str) -> str:
    """The startup line of a model with MoE layers: where the experts are, how tokens are
    routed and how the experts' products run."""
    layers = [i for i in range(config.num_layers) if config.is_moe_layer(i)]
    up = config.intermediate_size * (2 if config.activation in GATED else 1)
    grouped = grouped_gemm(device_type, dtype, config.hidden_size, up, config.intermediate_size)
    return (f"moe: {config.moe_num_experts} experts in layers {', '.join(map(str, layers))}, "
            f"{config.moe_top_k} per token ({config.moe_router_type} router); the experts run "
            + ("as one grouped product per layer (torch._grouped_mm)" if grouped
               else "one after another"))


def grouped_gemm(device_type: str, dtype: torch.dtype, *widths: int) -> bool:
    """Whether the experts run as one grouped matrix product (torch._grouped_mm) rather than a
    loop: fp32 CPU tensors, where it is about 1.8x the loop's speed (8 experts of a 125M model),
    and bf16 CUDA tensors; rows of every operand (`widths` elements) must be 16-byte aligned.
    bf16 on CPU keeps the loop, whose products run in fp32 (megatron/mpu/products.py)."""
    size = torch.empty(0, dtype=dtype).element_size()
    if not hasattr(torch, "_grouped_mm") or any(w * size % 16 for w in widths):
        return False
    if device_type == "cuda":
        return dtype == torch.bfloat16
    return device_type == "cpu" and dtype == torch.float32


class _GroupedMM(torch.autograd.Function):
    """y = torch._grouped_mm(x, w, offs): rows offs[e-1]..offs[e] of x [N, in] times w[e]
    [in, out]. The backward is two grouped products as well, on a contiguous gradient."""

    @staticmethod
    def forward(ctx, x, w, offsets):
        ctx.save_for_backward(x, w, offsets)
        return torch._grouped_mm(x, w, offs=offsets)  # [N, out]

    @staticmethod
    def backward(ctx, grad):
        x, w, offsets = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = torch._grouped_mm(grad, w.transpose(-2, -1), offs=offsets)  # [N, in]
        grad_w = torch._grouped_mm(x.t(), grad, offs=offsets)  # [E, in, out], per group
        return grad_x, grad_w, None


def load_balancing_loss(logits: torch.Tensor, experts: torch.Tensor,
                        fp32: bool = True) -> torch.Tensor:
    """num_experts * sum_e (assignments to e / tokens) * (mean softmax probability of e)."""
    num_experts = logits.shape[-1]
    probs = torch.softmax(logits.float() if fp32 else logits, dim=-1)  # [T, E]
    share = torch.bincount(experts.reshape(-1), minlength=num_experts) / logits.shape[0]
    return num_experts * (share.to(probs.dtype) * probs.mean(0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """mean over tokens of logsumexp(logits)^2 (ST-MoE), which keeps router logits small."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


@contextlib.contextmanager
def aux_loss_scale(scale: float):
    """Within, the auxiliary losses' gradients are multiplied by `scale`: the factor the
    training loss's gradient carries (1 / accumulation steps, times the fp16 loss scale)."""
    saved, _GRAD_SCALE[0] = _GRAD_SCALE[0], scale
    try:
        yield
    finally:
        _GRAD_SCALE[0] = saved


class AttachAuxLoss(torch.autograd.Function):
    """Identity on `out`; in the backward, d(aux)/d(aux) times the current gradient scale flows
    into `aux`, as if it had been added to the training loss."""

    @staticmethod
    def forward(ctx, out, aux):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), _GRAD_SCALE[0], device=grad.device)


@dataclass
class MoEStats:
    """One MoE layer over some training forwards: assignments per expert [E] (summed), the mean
    load-balancing and z losses, and how many forwards."""

    load: torch.Tensor
    balance_loss: float
    z_loss: float
    forwards: int


class MoE(nn.Module):
    """Router plus experts in place of a transformer layer's MLP: x [b, s, h] -> [b, s, h],
    every token's output the weighted sum of its k experts' outputs."""

    def __init__(self, config, init_fn, out_init_fn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP):
        super().__init__()
        self.tp = tp
        self.num_experts = config.moe_num_experts
        self.router = Router(config.hidden_size, config.moe_num_experts, config.moe_top_k,
                             config.moe_router_type, config.moe_jitter_eps,
                             config.moe_normalize_topk, init_fn, gen)
        self.experts = Experts(config.hidden_size, config.intermediate_size,
                               config.moe_num_experts, config.activation, init_fn, out_init_fn,
                               gen, tp, config.fp32_products)
        self.coeffs = (config.moe_aux_loss_coeff, config.moe_z_loss_coeff)
        self.lbl_fp32 = config.moe_lbl_in_fp32
        self._sums: list = []  # [load, balance, z, forwards] since take_stats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [b, s, h] -> [b, s, h]
        flat = x.reshape(-1, x.shape[-1])  # [T, h]
        routing = self.router(flat)
        k = routing.experts.shape[1]
        expert_of = routing.experts.reshape(-1)  # [T k]
        order = torch.argsort(expert_of, stable=True)  # assignments grouped by expert
        load = torch.bincount(expert_of, minlength=self.num_experts)  # [E]
        # the experts of this tensor rank (with expert parallelism, those of all its peers in
        # the expert-parallel group, which hold them block by block in that order)
        count = self.num_experts // self.tp.size
        first = self.tp.rank * count
        ends = torch.cumsum(load, 0).tolist()
        begin, end = (ends[first - 1] if first else 0), ends[first + count - 1]
        mine = order[begin:end]  # their assignments, grouped by expert
        token_of = mine // k
        inputs = copy_to_tensor_parallel(flat, self.tp)  # backward: sum the partial grads
        weights = copy_to_tensor_parallel(routing.weights, self.tp)
        counts = load[first:first + count].tolist()
        if self.tp.ep.enabled:  # to the experts' ranks and back (moe_dispatch.py)
            out = exchange_and_compute(inputs[token_of], counts, self.experts, self.tp.ep.group)
        else:
            out = self.experts(inputs[token_of], counts)  # [n, h]
        out = out * weights.reshape(-1)[mine].unsqueeze(-1).to(out.dtype)
        combined = torch.zeros_like(flat).index_add_(0, token_of, out.to(flat.dtype))
        combined = reduce_from_tensor_parallel(combined, self.tp)
        if self.training:  # the router losses: for the loss and the log, not at inference
            balance = load_balancing_loss(routing.logits, routing.experts, self.lbl_fp32)
            z = router_z_loss(routing.logits)
            self._record(load, balance, z)
            aux = self.coeffs[0] * balance + self.coeffs[1] * z
            if torch.is_grad_enabled() and any(self.coeffs):
                combined = AttachAuxLoss.apply(combined, aux)
        return combined.view_as(x)

    def _record(self, load: torch.Tensor, balance: torch.Tensor, z: torch.Tensor) -> None:
        values = [load.detach(), balance.detach().float(), z.detach(), 1]
        self._sums = values if not self._sums else [a + b for a, b in zip(self._sums, values)]

    def take_stats(self) -> MoEStats | None:
        """The load and mean losses of the training forwards since the last call (None if
        there were none); starts a new count."""
        if not self._sums:
            return None
        load, balance, z, n = self._sums
        self._sums = []
        return MoEStats(load.cpu(), balance.item() / n, z.item() / n, n)
