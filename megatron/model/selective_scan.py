"""Mamba-1's selective scan and causal depthwise convolution in plain torch, with their one-step
decoding forms.

Shapes: b batch, d channels (d_inner), l sequence length, n state size, k conv kernel width.

Selective scan (mamba_ssm's `selective_scan_ref`). With delta = softplus(delta + delta_bias)
(bias and softplus optional) and A [d, n] already negative (-exp(A_log)), each step is

    h_t = exp(delta_t A) * h_{t-1} + (delta_t u_t) B_t        # [b, d, n]; h_0 = initial_state or 0
    y_t = sum_n C_t h_t  (+ D u_t)                             # [b, d]
    y   = y * silu(z)                                          # if z is given

(exp(delta A) is the zero-order hold of A, delta B the Euler step of B.) The maths runs in fp32
(fp64 when an input is fp64); y comes back in u's dtype, the final state h_l in the maths dtype.

`method="reference"` runs the recurrence one step at a time: the ground truth, and what
GPT-NeoX's non-fused path computes. `method="chunked"` (and "auto") gives the same numbers with
a dozen whole-chunk tensor ops per `chunk` steps. Within a chunk write X_s = (delta_s u_s) B_s
and S_t = A cum_t, cum_t = delta_1 + ... + delta_t (A does not depend on t). Then

    h_t = exp(S_t) h_0 + sum_{s <= t} exp(S_t - S_s) X_s
        = E_t * (exp(A m) h_0 + cumsum_s(X_s F_s)),    E_t = exp(A (cum_t - m)), F_s = 1 / E_s,

for any reference m [b, d]. With m the middle of the chunk's range of cum (0 included), every
exponent lies in [-R, R], R = max_n |A| * (range of cum) / 2. While R <= _HALF_RANGE neither E
nor F can overflow; a chunk where some channel's R is larger is halved until its parts fit,
and a part of a few steps that still does not fit runs as the recurrence (large steps of delta,
where states forget within a step or two). So no exponential of an unbounded cumulative sum is
ever taken. Summing by cumsum rounds like the recurrence: the error at t is about
eps * sum_s exp(S_t - S_s) |X_s| either way. The state crosses chunk boundaries in a loop over
the l / chunk chunks; all chunks' bounds are checked at once (one device-to-host sync, and one
more per part of a chunk that had to be halved).

The chunk's backward is written out (`_ChunkScan`): the adjoint of the recurrence,
g_t = C_t dy_t + exp(a_{t+1}) g_{t+1} with a_t = delta_t A, is the same closed form run
backwards, and then dX_t = g_t, d a_t = g_t exp(a_t) h_{t-1} = g_t (h_t - X_t). It recomputes
the chunk's [b, d, n, chunk] terms instead of keeping them: for the backward a chunk keeps its
[b, d, chunk] inputs and its first state, not [b, d, l, n] (parts run as the recurrence, and
method "reference", keep [b, d, n] per step). It is not differentiable twice.

Causal depthwise conv (Mamba's conv1d before the scan):

    out_t = sum_{j < k} weight[:, j] x_{t-k+1+j} (+ bias),   then silu if activation == "silu",

x_{<0} being the columns of `initial_state` or 0: F.conv1d with padding k-1, truncated to l. Its
state is the last k inputs [b, d, k], left-padded when fewer have been seen, as Hugging Face's
Mamba cache holds it. `causal_conv1d_update` and `selective_state_update` take one decoding step
from those states and give what the full-sequence functions give at that position.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

# Largest |exponent| the chunked form takes: e^60 ~ 1e26 leaves fp32 room for X * F and its sums.
_HALF_RANGE = 60.0
# A chunk that does not fit is halved down to this many steps; shorter parts that still do not
# fit run as the recurrence, which beats closed forms over one or two steps.
_SHORTEST_SPLIT = 8


def _maths_dtype(*tensors: Tensor | None) -> torch.dtype:
    """fp64 if any input is fp64, else fp32 (bf16 and fp16 inputs are computed in fp32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _discretize(delta: Tensor, delta_bias: Tensor | None, softplus: bool,
                dtype: torch.dtype) -> Tensor:
    """delta [b, d, l] -> softplus(delta + delta_bias), each part optional, in `dtype`."""
    delta = delta.to(dtype)
    if delta_bias is not None:
        delta = delta + delta_bias.to(dtype)[:, None]
    return F.softplus(delta) if softplus else delta


def _skip_and_gate(y: Tensor, u: Tensor, D: Tensor | None, z: Tensor | None) -> Tensor:
    """y [b, d, l] + D u, times silu(z); each part optional."""
    if D is not None:
        y = y + D.to(y.dtype)[:, None] * u.to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


def _scan_reference(h: Tensor, A: Tensor, delta: Tensor, bu: Tensor, B: Tensor,
                    C: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence one step at a time. h [b, d, n]; A [d, n]; delta, bu = delta * u
    [b, d, l]; B, C [b, n, l]. Returns the last state [b, d, n] and sum_n C_t h_t [b, d, l]."""
    # Step-major and contiguous, so that every step reads one contiguous [b, d, n] block.
    delta = delta.permute(2, 0, 1).contiguous()                           # [l, b, d]
    decay = torch.exp(delta.unsqueeze(-1) * A)                            # [l, b, d, n]
    B = B.permute(2, 0, 1).contiguous().unsqueeze(2)                      # [l, b, 1, n]
    X = bu.permute(2, 0, 1).contiguous().unsqueeze(-1) * B                # [l, b, d, n]
    C = C.permute(2, 0, 1).unsqueeze(-1)                                  # [l, b, n, 1]
    ys = []
    for decay_t, X_t, C_t in zip(decay.unbind(0), X.unbind(0), C.unbind(0)):
        h = torch.addcmul(X_t, decay_t, h)                                # [b, d, n]
        ys.append(torch.bmm(h, C_t))                                      # [b, d, 1]
    return h, torch.cat(ys, dim=-1)


def _exponent_bound(delta: Tensor, A_abs: Tensor) -> Tensor:
    """max over (b, d) of max_n |A| * (range of cumsum(delta), 0 included), for each chunk of
    delta [b, d, c, T]; A_abs [d] is max_n |A|. Returns [c]."""
    cum = delta.detach().cumsum(-1)
    span = cum.amax(-1).clamp(min=0) - cum.amin(-1).clamp(max=0)         # [b, d, c]
    return (span * A_abs[:, None]).amax(dim=(0, 1))


def _fits(bound: Tensor) -> Tensor:
    """Whether exponents up to `bound` are safe; NaN counts as safe (it stays NaN either way)."""
    return ~(bound > 2 * _HALF_RANGE)


def _decays(A: Tensor, delta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Over one chunk of T steps (delta [b, d, T]): E_t and F_t = 1 / E_t [b, d, n, T], and
    exp(A m) [b, d, n], m being the middle of the range of cumsum(delta), 0 included."""
    cum = delta.cumsum(-1)                                                # [b, d, T]
    mid = (cum.amax(-1).clamp(min=0) + cum.amin(-1).clamp(max=0)) / 2    # [b, d]
    exponent = (cum - mid.unsqueeze(-1)).unsqueeze(2) * A.unsqueeze(-1)   # [b, d, n, T]
    grow = torch.exp(exponent)
    return grow, exponent.neg_().exp_(), torch.exp(mid.unsqueeze(-1) * A)


def _states(h: Tensor, grow: Tensor, scaled: Tensor, start: Tensor) -> Tensor:
    """h_t = E_t (exp(A m) h_0 + cumsum_s(X_s F_s)) [b, d, n, T], written over scaled = X F."""
    return scaled.cumsum_(-1).add_((start * h).unsqueeze(-1)).mul_(grow)


class _ChunkScan(torch.autograd.Function):
    """One chunk in closed form (its exponent bound fitting); arguments as _scan_reference.
    The backward recomputes the chunk's [b, d, n, T] terms rather than keeping them, and runs
    the recurrence's adjoint g_t = G_t + exp(a_{t+1}) g_{t+1} (G_t = C_t dy_t) in the same
    closed form, backwards."""

    @staticmethod
    def forward(ctx, h: Tensor, A: Tensor, delta: Tensor, bu: Tensor, B: Tensor,
                C: Tensor) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(h, A, delta, bu, B, C)
        grow, shrink, start = _decays(A, delta)
        scaled = shrink.mul_(B.unsqueeze(1)).mul_(bu.unsqueeze(2))        # X F [b, d, n, T]
        states = _states(h, grow, scaled, start)
        last = states[..., -1].clone()                                    # [b, d, n]
        return last, states.mul_(C.unsqueeze(1)).sum(2)                   # y [b, d, T]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_last: Tensor, g_y: Tensor) -> tuple[Tensor, ...]:
        h, A, delta, bu, B, C = ctx.saved_tensors
        grow, shrink, start = _decays(A, delta)
        X = bu.unsqueeze(2) * B.unsqueeze(1)                              # [b, d, n, T]
        states = _states(h, grow, X * shrink, start)
        G = g_y.unsqueeze(2) * C.unsqueeze(1)                             # [b, d, n, T]
        G[..., -1] += g_last
        # sum_{t >= s} G_t E_t; times F_s it is g_s = sum_{t >= s} exp(S_t - S_s) G_t.
        later = G.mul_(grow).flip(-1).cumsum_(-1).flip(-1)
        g_h = start * later[..., 0]                                       # [b, d, n]
        g = later.mul_(shrink)                                            # d loss / d h_s, X_s
        g_bu = (g * B.unsqueeze(1)).sum(2)                                # [b, d, T]
        g_B = (g * bu.unsqueeze(2)).sum(1)                                # [b, n, T]
        g_C = (states * g_y.unsqueeze(2)).sum(1)                          # [b, n, T]
        g_log = g.mul_(states.sub_(X))          # d loss / d (delta_t A) = g_t exp(a_t) h_{t-1}
        g_delta = (g_log * A.unsqueeze(-1)).sum(2)                        # [b, d, T]
        g_A = g_log.mul_(delta.unsqueeze(2)).sum((0, 3))                  # [d, n]
        return g_h, g_A, g_delta, g_bu, g_B, g_C


def _scan_fitted(h: Tensor, A: Tensor, delta: Tensor, bu: Tensor, B: Tensor, C: Tensor,
                 A_abs: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk, halved until each part's exponents fit; a part of _SHORTEST_SPLIT steps or
    fewer that does not fit runs as the recurrence."""
    if _fits(_exponent_bound(delta.unsqueeze(2), A_abs)).item():
        return _ChunkScan.apply(h, A, delta, bu, B, C)
    length = delta.shape[-1]
    if length <= _SHORTEST_SPLIT:
        return _scan_reference(h, A, delta, bu, B, C)
    first, rest = zip(*(x.split((length + 1) // 2, dim=-1) for x in (delta, bu, B, C)))
    h, y_first = _scan_fitted(h, A, *first, A_abs)
    h, y_rest = _scan_fitted(h, A, *rest, A_abs)
    return h, torch.cat([y_first, y_rest], dim=-1)


def _scan_chunked(h: Tensor, A: Tensor, delta: Tensor, bu: Tensor, B: Tensor, C: Tensor,
                  chunk: int) -> tuple[Tensor, Tensor]:
    """Chunk by chunk, the state carried between them; arguments as _scan_reference."""
    b, d, length = delta.shape
    count = -(-length // chunk)
    A_abs = A.detach().abs().amax(-1)                                     # [d]
    # Zero-padding delta leaves each chunk's range of cumsum as it is.
    padded = F.pad(delta.detach(), (0, count * chunk - length)).view(b, d, count, chunk)
    fits = _fits(_exponent_bound(padded, A_abs)).tolist()                # one sync for all
    # split, not slicing: its backward joins the chunks' gradients in one copy.
    parts = zip(*(x.split(chunk, dim=-1) for x in (delta, bu, B, C)))
    ys = []
    for fit, part in zip(fits, parts):
        h, y = _ChunkScan.apply(h, A, *part) if fit else _scan_fitted(h, A, *part, A_abs)
        ys.append(y)
    return h, torch.cat(ys, dim=-1)


# Each takes (h, A, delta, bu, B, C, chunk) and returns (last state, sum_n C_t h_t).
SCAN_METHODS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "reference": lambda h, A, delta, bu, B, C, chunk: _scan_reference(h, A, delta, bu, B, C),
    "chunked": _scan_chunked,
    "auto": _scan_chunked,
}


def _check_scan_shapes(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                       initial_state: Tensor | None) -> None:
    b, d, length = u.shape
    n = A.shape[-1]
    expected = {"delta": (delta, (b, d, length)), "A": (A, (d, n)), "B": (B, (b, n, length)),
                "C": (C, (b, n, length))}
    if initial_state is not None:
        expected["initial_state"] = (initial_state, (b, d, n))
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"selective_scan: {name} has shape {tuple(tensor.shape)}, expected "
                             f"{shape} for u {tuple(u.shape)} and A {tuple(A.shape)}")


def selective_scan(u: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor,
                   D: Tensor | None = None, z: Tensor | None = None,
                   delta_bias: Tensor | None = None, delta_softplus: bool = True,
                   method: str = "chunked", initial_state: Tensor | None = None,
                   return_state: bool = False,
                   chunk: int = 64) -> Tensor | tuple[Tensor, Tensor]:
    """u, delta, z: [b, d, l]; A: [d, n] (already negative: -exp(A_log)); B, C: [b, n, l];
    D, delta_bias: [d]. Returns y [b, d, l] in u's dtype, and with return_state also the final
    state h_l [b, d, n] (fp32; fp64 for fp64 inputs). initial_state: [b, d, n] or None (zeros).
    method: "chunked" (= "auto") or "reference"; chunk: steps per chunk of "chunked"."""
    if method not in SCAN_METHODS:
        raise ValueError(f"selective_scan: unknown method {method!r}; valid: "
                         f"{sorted(SCAN_METHODS)}")
    if chunk < 1:
        raise ValueError(f"selective_scan: chunk must be at least 1, got {chunk}")
    _check_scan_shapes(u, delta, A, B, C, initial_state)
    dtype = _maths_dtype(u, delta, A, B, C, initial_state)
    delta = _discretize(delta, delta_bias, delta_softplus, dtype)         # [b, d, l]
    if initial_state is None:
        h = u.new_zeros(u.shape[0], u.shape[1], A.shape[-1], dtype=dtype)
    else:
        h = initial_state.to(dtype)
    h, y = SCAN_METHODS[method](h, A.to(dtype), delta, delta * u.to(dtype), B.to(dtype),
                                C.to(dtype), chunk)
    y = _skip_and_gate(y, u, D, z).to(u.dtype)
    return (y, h) if return_state else y


def selective_state_update(state: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor,
                           C: Tensor, D: Tensor | None = None, z: Tensor | None = None,
                           dt_bias: Tensor | None = None, dt_softplus: bool = True) -> Tensor:
    """One decoding step. state [b, d, n] fp32 (updated in place and returned via y only);
    x, dt, z: [b, d]; B, C: [b, n]. Returns y [b, d] in x's dtype. Same formulas as one step of
    selective_scan."""
    dtype = _maths_dtype(state, x, dt, A, B, C)
    delta = _discretize(dt.unsqueeze(-1), dt_bias, dt_softplus, dtype)  # [b, d, 1]
    u = x.unsqueeze(-1)                                                   # [b, d, 1]
    h, y = _scan_reference(state.to(dtype), A.to(dtype), delta, delta * u.to(dtype),
                           B.unsqueeze(-1).to(dtype), C.unsqueeze(-1).to(dtype))
    state.copy_(h)
    gate = None if z is None else z.unsqueeze(-1)
    return _skip_and_gate(y, u, D, gate).squeeze(-1).to(x.dtype)


CONV_ACTIVATIONS: dict[str | None, Callable[[Tensor], Tensor]] = {
    None: lambda x: x, "silu": F.silu, "swish": F.silu,
}


def _conv_weight(weight: Tensor, activation: str | None) -> Tensor:
    """weight [d, k] or [d, 1, k] -> [d, k]; also checks the activation's name."""
    if activation not in CONV_ACTIVATIONS:
        raise ValueError(f"causal_conv1d: unknown activation {activation!r}; valid: "
                         f"{list(CONV_ACTIVATIONS)}")
    if weight.dim() == 3:
        if weight.shape[1] != 1:
            raise ValueError(f"causal_conv1d: depthwise weight must be [d, 1, k], got "
                             f"{tuple(weight.shape)}")
        weight = weight[:, 0]
    return weight


def _last_columns(x: Tensor, k: int) -> Tensor:
    """The last k columns of x [b, d, l], left-padded with zeros when l < k, as a new tensor."""
    if x.shape[-1] >= k:
        return x[..., x.shape[-1] - k:].clone()
    return F.pad(x, (k - x.shape[-1], 0))


def causal_conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None,
                  activation: str | None = "silu", initial_state: Tensor | None = None,
                  return_state: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Depthwise causal conv: x [b, d, l]; weight [d, k] (or [d, 1, k]); bias [d].
    out_t = sum_{j<k} weight[:, j] * x_{t-k+1+j} (+ bias), with x_{<0} the last columns of
    initial_state ([b, d, w], any w, zeros left of it) or 0; then the activation (None, "silu").
    With return_state also the conv state [b, d, k]: the last k inputs, initial_state's columns
    or zeros before x when l < k. Output in x's dtype, computed in fp32 (fp64 for fp64 x)."""
    weight = _conv_weight(weight, activation)                             # [d, k]
    k = weight.shape[-1]
    dtype = _maths_dtype(x, weight)
    history = x if initial_state is None else torch.cat([initial_state.to(x.dtype), x], -1)
    past = k - 1 - (history.shape[-1] - x.shape[-1])                      # zero columns needed
    inputs = F.pad(history, (past, 0)) if past > 0 else history[..., -past:]
    out = F.conv1d(inputs.to(dtype), weight.to(dtype).unsqueeze(1),
                   None if bias is None else bias.to(dtype), groups=weight.shape[0])
    out = CONV_ACTIVATIONS[activation](out).to(x.dtype)                   # [b, d, l]
    return (out, _last_columns(history, k)) if return_state else out


def causal_conv1d_update(conv_state: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None = None,
                         activation: str | None = "silu") -> Tensor:
    """One decoding step: conv_state [b, d, k] (shifted left by one, x [b, d] appended, in
    place); returns the conv output [b, d] for this step, in x's dtype."""
    weight = _conv_weight(weight, activation)                             # [d, k]
    dtype = _maths_dtype(x, weight)
    conv_state.copy_(torch.roll(conv_state, shifts=-1, dims=-1))
    conv_state[..., -1] = x
    out = (conv_state.to(dtype) * weight.to(dtype)).sum(-1)               # [b, d]
    if bias is not None:
        out = out + bias.to(dtype)
    return CONV_ACTIVATIONS[activation](out).to(x.dtype)
