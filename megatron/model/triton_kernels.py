"""Triton kernels for the fused paths GPT-NeoX's fusion flags select, with their autograd wrappers.

Every op here has a torch reference beside its user (megatron/model/norms.py, positional.py,
activations.py, block.py) with the same signature; `megatron/model/fusions.py` decides which of
the two runs. The kernels compute in fp32 whatever the storage dtype and round once on the store.

- `norm`: LayerNorm or RMSNorm of the last dimension, one row per program; the backward writes
  the input gradient per row and per-program partial sums of the weight gradient (summed in torch).
- `rotary`: GPT-NeoX's rotate-half rotary embedding of the first `r` channels of each head, the
  rest copied; its backward is the same kernel rotating the other way.
- `gated`: act(gate) * value for SwiGLU / GeGLU / ReGLU over [..., 2f] (value first, gate second).
- `bias_gelu`: tanh-approximate GELU of x + bias, GPT-NeoX's `bias_gelu_fusion` function.
- `bias_dropout_add`: residual + dropout(x + bias). The keep mask comes from Philox seeded by a
  number drawn from torch's generator of the tensor's device (so the tensor-parallel RNG fork,
  activation recompute and checkpoint resume see the same masks) and is regenerated, not stored,
  for the backward.

Importing this module needs `triton`. Kernels run on GPU tensors, or on CPU tensors when the
process started with TRITON_INTERPRET=1 (Triton's interpreter: slow, used by the tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl



def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as a contiguous [rows, last] matrix."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _programs(rows: int, device: torch.device) -> int:
    """How many programs share a reduction over rows: enough to fill the device, no more."""
    if device.type == "cuda":
        return max(1, min(rows, 4 * torch.cuda.get_device_properties(device).multi_processor_count))
    return max(1, min(rows, 4))


def _warps(block: int) -> int:
    return min(max(block // 256, 1), 16)


# ---------------------------------------------------------------- LayerNorm / RMSNorm

@triton.jit
def _norm_fwd(X, W, B, Y, MEAN, RSTD, N, eps,
              RMS: tl.constexpr, ROUND_XHAT: tl.constexpr, HAS_B: tl.constexpr,
              BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=0) / N
        xc = tl.where(mask, x - mean, 0.0)
        tl.store(MEAN + row, mean)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=0) / N + eps)
    tl.store(RSTD + row, rstd)
    xhat = xc * rstd
    if ROUND_XHAT:  # the RMSNorm reference rounds x * rstd to the input dtype before the scale
        xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
    y = xhat * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd(DY, X, W, MEAN, RSTD, DX, DW, rows, N, ROWS_PER_PROGRAM: tl.constexpr,
              RMS: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, ROWS_PER_PROGRAM):
        row = pid.to(tl.int64) * ROWS_PER_PROGRAM + i
        mask = (cols < N) & (row < rows)
        x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row, mask=row < rows, other=0.0)
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(MEAN + row, mask=row < rows, other=0.0)) * rstd, 0.0)
        g = dy * w
        dx = g - xhat * (tl.sum(g * xhat, axis=0) / N)
        if not RMS:
            dx -= tl.sum(g, axis=0) / N
        tl.store(DX + row * N + cols, (dx * rstd).to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
    tl.store(DW + pid * N + cols, dw, mask=cols < N)


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps: float, rms: bool):
        x2 = _rows(x)
        rows, n = x2.shape
        out_dtype = torch.promote_types(x.dtype, weight.dtype)
        y = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        block = triton.next_power_of_2(n)
        _norm_fwd[(rows,)](x2, weight, bias if bias is not None else weight, y, mean, rstd, n, eps,
                           RMS=rms, ROUND_XHAT=rms, HAS_B=bias is not None, BLOCK=block,
                           num_warps=_warps(block))
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.rms, ctx.has_bias, ctx.shape = rms, bias is not None, x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        rows, n = x2.shape
        dy2 = _rows(dy)
        dx = torch.empty_like(x2)
        per_program = triton.cdiv(rows, _programs(rows, x2.device))
        programs = triton.cdiv(rows, per_program)
        dw = torch.empty(programs, n, dtype=torch.float32, device=x2.device)
        block = triton.next_power_of_2(n)
        _norm_bwd[(programs,)](dy2, x2, weight, mean, rstd, dx, dw, rows, n, per_program, RMS=ctx.rms,
                               BLOCK=block, num_warps=_warps(block))
        dbias = dy2.sum(0, dtype=torch.float32).to(weight.dtype) if ctx.has_bias else None
        return dx.view(ctx.shape), dw.sum(0).to(weight.dtype), dbias, None, None


def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
         rms: bool) -> torch.Tensor:
    """LayerNorm (rms=False) or RMSNorm (rms=True) of x's last dimension, scaled by `weight`
    and shifted by `bias` when given."""
    return _Norm.apply(x, weight, bias, eps, rms)


# ---------------------------------------------------------------- rotary embedding

_ROTARY_ELEMENTS = 4096  # channels each program of the rotary kernel rotates


@triton.jit
def _rotary(X, COS, SIN, Y, ROWS, H, S, sxb, sxh, sxs, scb, scs, R, D, SIGN: tl.constexpr,
            BLOCK_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # BLOCK_ROWS rows (one head of one token each) of BLOCK channels per program: rows of a
    # single head (128 channels, 256 bytes) per program leave the GPU waiting on each program
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    live = rows < ROWS
    s = (rows % S).to(tl.int64)
    h = ((rows // S) % H).to(tl.int64)
    b = (rows // S // H).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    half = R // 2
    in_head = live[:, None] & (cols < D)[None, :]
    in_rot = live[:, None] & (cols < R)[None, :]
    src = X + (b * sxb + h * sxh + s * sxs)[:, None]
    x = tl.load(src + cols[None, :], mask=in_head, other=0.0).to(tl.float32)
    partner = tl.where(cols < half, cols + half, cols - half)
    xp = tl.load(src + partner[None, :], mask=in_rot, other=0.0).to(tl.float32)
    table = (b * scb + s * scs)[:, None] + cols[None, :]
    c = tl.load(COS + table, mask=in_rot, other=1.0)
    sn = tl.load(SIN + table, mask=in_rot, other=0.0)
    # forward (SIGN -1): first half x*cos - partner*sin, second half x*cos + partner*sin;
    # the backward (SIGN +1) rotates by the opposite angle.
    sign = tl.where(cols < half, SIGN * 1.0, -SIGN * 1.0)[None, :]
    y = tl.where(in_rot, x * c + sign * xp * sn, x)
    dst = Y + (((b * H + h) * S + s) * D)[:, None] + cols[None, :]
    tl.store(dst, y.to(Y.dtype.element_ty), mask=in_head)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    b, h, s, d = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    r = cos.shape[-1]
    cos, sin = cos.float().expand(b, 1, s, r), sin.float().expand(b, 1, s, r)
    if cos.stride(-1) != 1:
        cos, sin = cos.contiguous(), sin.contiguous()
    y = torch.empty((b, h, s, d), dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(d)
    rows = b * h * s
    block_rows = max(1, min(_ROTARY_ELEMENTS // block, triton.next_power_of_2(rows)))
    _rotary[(triton.cdiv(rows, block_rows),)](
        x, cos, sin, y, rows, h, s, x.stride(0), x.stride(1), x.stride(2), cos.stride(0),
        cos.stride(2), r, d, SIGN=sign, BLOCK_ROWS=block_rows, BLOCK=block,
        num_warps=_warps(block_rows * block))
    return y


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin):
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin, -1)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        return _rotate(dy, cos, sin, 1), None, None


# The same kernel as an operator torch.compile keeps opaque: inside a compiled layer inductor
# would otherwise write its own rotary, fused with the read of the queries out of the QKV
# output and with the cos/sin tables recomputed per element; on an H200 that kernel took 1.1 ms
# a layer at 1-3B, several times what the bytes need.
@torch.library.custom_op("neox::rotary", mutates_args=())
def _rotary_op(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: int) -> torch.Tensor:
    return _rotate(x, cos, sin, sign)


@_rotary_op.register_fake
def _(x, cos, sin, sign):
    return x.new_empty(x.shape)  # [b, heads, s, d], contiguous as _rotate writes it


def _rotary_op_context(ctx, inputs, output):
    _, cos, sin, sign = inputs
    ctx.save_for_backward(cos, sin)
    ctx.sign = sign


def _rotary_op_backward(ctx, dy):
    cos, sin = ctx.saved_tensors
    return _rotary_op(dy, cos, sin, -ctx.sign), None, None, None


_rotary_op.register_autograd(_rotary_op_backward, setup_context=_rotary_op_context)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first r = cos.shape[-1] channels of x [b, heads, s, d] by the angles whose
    cos/sin tables [b, 1, s, r] (both halves equal, as RotaryEmbedding.cos_sin makes them) are
    given; the other d - r channels pass through. Inside torch.compile the kernel runs as the
    opaque operator `neox::rotary`; eager, through an autograd function (less host time)."""
    if torch.compiler.is_compiling():
        return _rotary_op(x, cos, sin, -1)
    return _Rotary.apply(x, cos, sin)


# ---------------------------------------------------------------- gated activations

ACT_CODES = {"silu": 0, "gelu": 1, "relu": 2}


@triton.jit
def _act(g, ACT: tl.constexpr):
    if ACT == 0:
        return g * tl.sigmoid(g)
    elif ACT == 1:
        return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))
    else:
        return tl.maximum(g, 0.0)


@triton.jit
def _act_grad(g, ACT: tl.constexpr):
    if ACT == 0:
        sig = tl.sigmoid(g)
        return sig * (1.0 + g * (1.0 - sig))
    elif ACT == 1:
        return (0.5 * (1.0 + tl.erf(g * 0.7071067811865476)) +
                g * 0.3989422804014327 * tl.exp(-0.5 * g * g))
    else:
        return tl.where(g > 0.0, 1.0, 0.0)


@triton.jit
def _gated(X, DY, OUT, F, ACT: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    v = tl.load(X + row * 2 * F + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(X + row * 2 * F + F + cols, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        dy = tl.load(DY + row * F + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + row * 2 * F + cols, (dy * _act(g, ACT)).to(OUT.dtype.element_ty),
                 mask=mask)
        tl.store(OUT + row * 2 * F + F + cols,
                 (dy * v * _act_grad(g, ACT)).to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT + row * F + cols, (_act(g, ACT) * v).to(OUT.dtype.element_ty), mask=mask)


_GATED_BLOCK = 1024


class _Gated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act: str):
        x2 = _rows(x)
        rows, f = x2.shape[0], x2.shape[1] // 2
        y = torch.empty(rows, f, dtype=x.dtype, device=x.device)
        grid = (rows, triton.cdiv(f, _GATED_BLOCK))
        _gated[grid](x2, x2, y, f, ACT=ACT_CODES[act], BACKWARD=False, BLOCK=_GATED_BLOCK)
        ctx.save_for_backward(x2)
        ctx.act, ctx.shape = act, x.shape
        return y.view(*x.shape[:-1], f)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        rows, f = x2.shape[0], x2.shape[1] // 2
        dx = torch.empty_like(x2)
        grid = (rows, triton.cdiv(f, _GATED_BLOCK))
        _gated[grid](x2, _rows(dy), dx, f, ACT=ACT_CODES[ctx.act], BACKWARD=True,
                     BLOCK=_GATED_BLOCK)
        return dx.view(ctx.shape), None


def gated(x: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * value for x [..., 2f] = [value | gate] -> [..., f]; act is silu, gelu or relu."""
    return _Gated.apply(x, act)


# ---------------------------------------------------------------- bias + tanh GELU

@triton.jit
def _bias_gelu(X, B, DY, OUT, n, N, HAS_B: tl.constexpr, BACKWARD: tl.constexpr,
               BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        x += tl.load(B + offs % N, mask=mask, other=0.0).to(tl.float32)
    inner = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh(inner)
    if BACKWARD:
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        slope = (0.5 * (1.0 + t) +
                 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x))
        tl.store(OUT + offs, (dy * slope).to(OUT.dtype.element_ty), mask=mask)
    else:
        tl.store(OUT + offs, (0.5 * x * (1.0 + t)).to(OUT.dtype.element_ty), mask=mask)


_ELEMENT_BLOCK = 1024


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias):
        x = x.contiguous()
        y = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), _ELEMENT_BLOCK),)
        _bias_gelu[grid](x, bias if bias is not None else x, x, y, x.numel(), x.shape[-1],
                         HAS_B=bias is not None, BACKWARD=False, BLOCK=_ELEMENT_BLOCK)
        ctx.save_for_backward(x, bias)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx = torch.empty_like(x)
        grid = (triton.cdiv(x.numel(), _ELEMENT_BLOCK),)
        _bias_gelu[grid](x, bias if bias is not None else x, dy.contiguous(), dx, x.numel(),
                         x.shape[-1], HAS_B=bias is not None, BACKWARD=True,
                         BLOCK=_ELEMENT_BLOCK)
        dbias = _rows(dx).sum(0, dtype=torch.float32).to(bias.dtype) if bias is not None else None
        return dx, dbias


def bias_gelu(x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu(x + bias) with GELU's tanh approximation (bias over the last dimension, or None)."""
    return _BiasGelu.apply(x, bias)


# ---------------------------------------------------------------- bias + dropout + residual add

@triton.jit
def _bias_dropout_add(X, B, RES, DY, OUT, SEED, n, N, p,
                      HAS_B: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    keep = tl.rand(tl.load(SEED), offs) >= p
    scale = 1.0 / (1.0 - p)
    if BACKWARD:
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(OUT + offs, tl.where(keep, dy * scale, 0.0).to(OUT.dtype.element_ty), mask=mask)
    else:
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            x += tl.load(B + offs % N, mask=mask, other=0.0).to(tl.float32)
        res = tl.load(RES + offs, mask=mask, other=0.0).to(tl.float32)
        out = res + tl.where(keep, x * scale, 0.0)
        tl.store(OUT + offs, out.to(OUT.dtype.element_ty), mask=mask)


class _BiasDropoutAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, residual, p: float):
        if x.numel() >= 2 ** 31:
            raise ValueError(f"bias_dropout_add takes under 2^31 elements; got {x.numel()}")
        x, residual = x.contiguous(), residual.contiguous()
        # drawn from the device's generator, so RNG forks, recompute and resume reproduce it
        seed = torch.randint(0, 2 ** 31 - 1, (1,), device=x.device, dtype=torch.int64)
        out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype),
                          device=x.device)
        grid = (triton.cdiv(x.numel(), _ELEMENT_BLOCK),)
        _bias_dropout_add[grid](x, bias if bias is not None else x, residual, x, out, seed,
                                x.numel(), x.shape[-1], p, HAS_B=bias is not None,
                                BACKWARD=False, BLOCK=_ELEMENT_BLOCK)
        ctx.save_for_backward(seed)
        ctx.p, ctx.x_dtype, ctx.res_dtype, ctx.has_bias = p, x.dtype, residual.dtype, bias is not None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, dy):
        (seed,) = ctx.saved_tensors
        dy = dy.contiguous()
        dx = torch.empty(dy.shape, dtype=ctx.x_dtype, device=dy.device)
        grid = (triton.cdiv(dy.numel(), _ELEMENT_BLOCK),)
        _bias_dropout_add[grid](dy, dy, dy, dy, dx, seed, dy.numel(), dy.shape[-1], ctx.p,
                                HAS_B=False, BACKWARD=True, BLOCK=_ELEMENT_BLOCK)
        dbias = _rows(dx).sum(0, dtype=torch.float32).to(ctx.bias_dtype) if ctx.has_bias else None
        return dx, dbias, dy.to(ctx.res_dtype), None


def bias_dropout_add(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                     p: float) -> torch.Tensor:
    """residual + dropout(x + bias, p) in one pass (training only; bias over the last dim)."""
    return _BiasDropoutAdd.apply(x, bias, residual, p)


# ---------------------------------------------------------------- softmax cross entropy

# logits each program reads at a time, walking along its token's row; the vocabulary size is a
# compile-time constant of the kernels (one program per size, as a run has one)
_VOCAB_BLOCK = 4096


@triton.jit
def _ce_lse(X, LSE, sx, V: tl.constexpr, BLOCK: tl.constexpr):
    # one token's row per program, read once: a running maximum `top` and the sum of exp(x -
    # shift), where shift is the maximum so far (0 while it is not finite: an all -inf row
    # gives -inf, a +inf logit gives +inf, a NaN propagates through the sum)
    src = X + tl.program_id(0).to(tl.int64) * sx
    cols = tl.arange(0, BLOCK)
    top = tl.zeros([], dtype=tl.float32) - float("inf")
    shift = tl.zeros([], dtype=tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK):
        x = tl.load(src + start + cols, mask=start + cols < V, other=float("-inf")).to(tl.float32)
        top = tl.maximum(top, tl.max(x, axis=0))
        new_shift = tl.where(tl.abs(top) < float("inf"), top, 0.0)
        # rescale what was summed under the old shift (nothing summed yet: keep the 0, which an
        # overflowing factor would turn into NaN)
        total = tl.where(total > 0.0, total * tl.exp(shift - new_shift), total)
        total += tl.sum(tl.exp(x - new_shift), axis=0)
        shift = new_shift
    tl.store(LSE + tl.program_id(0), tl.log(total) + shift)


@triton.jit
def _ce_grad(X, DX, LSE, SCALE, LABEL, sx, sdx, V: tl.constexpr, BLOCK: tl.constexpr):
    # scale * (softmax(x) - one-hot(label)) of one token's row, written in DX's dtype; LABEL is
    # -1 where the label lies in another rank's vocabulary slice
    row = tl.program_id(0).to(tl.int64)
    lse = tl.load(LSE + row)
    scale = tl.load(SCALE + row)
    label = tl.load(LABEL + row)
    cols = tl.arange(0, BLOCK)
    for start in range(0, V, BLOCK):
        live = start + cols < V
        x = tl.load(X + row * sx + start + cols, mask=live, other=0.0).to(tl.float32)
        y = tl.exp(x - lse) * scale
        y = tl.where(start + cols == label, y - scale, y)
        tl.store(DX + row * sdx + start + cols, y.to(DX.dtype.element_ty), mask=live)


def _vocab_block(vocab: int) -> int:
    return min(_VOCAB_BLOCK, triton.next_power_of_2(vocab))


def logsumexp_rows(flat: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(row))) in fp32 of each row of `flat` [N, V] (any float dtype, rows of unit
    stride), each row read once: the forward of megatron/mpu/cross_entropy.py on GPUs."""
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    if flat.shape[0]:
        block = _vocab_block(flat.shape[1])
        _ce_lse[(flat.shape[0],)](flat, lse, flat.stride(0), flat.shape[1], BLOCK=block,
                                  num_warps=_warps(block))
    return lse


def cross_entropy_grad(flat: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor,
                       label: torch.Tensor) -> torch.Tensor:
    """scale * (softmax - one-hot(label)) of each row of `flat` [N, V], from its fp32 `lse` [N],
    in `flat`'s dtype; `scale` [N] fp32, `label` [N] int64 (-1: no label in this slice)."""
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(flat.shape, dtype=flat.dtype, device=flat.device)
    if flat.shape[0]:
        block = _vocab_block(flat.shape[1])
        _ce_grad[(flat.shape[0],)](flat, out, lse, scale.float().contiguous(), label.contiguous(),
                                   flat.stride(0), out.stride(0), flat.shape[1], BLOCK=block,
                                   num_warps=_warps(block))
    return out
