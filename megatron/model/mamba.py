"""Mamba layers (GPT-NeoX's `attention_config` type `mamba`): a pre-norm residual block whose
mixer is Mamba-1's selective state-space model, with no MLP.

    x + mixer(norm(x))            (no dropout, as GPT-NeoX's ParallelMambaResidualLayer)

The mixer, with d = mamba_inner_size channels (intermediate_size, else 2 * hidden_size), a state
of n = 16 per channel, a causal depthwise convolution of width 4 and dt_rank = ceil(h / 16):
    x, z   = in_proj(u) split in two halves of d channels          (h -> 2d)
    x      = silu(causal_conv1d(x))
    dt, B, C = x_proj(x) split [dt_rank, n, n]                     (d -> dt_rank + 2n)
    dt     = softplus(dt_proj.weight @ dt + dt_proj.bias)          (dt_rank -> d)
    h_t    = exp(dt_t A) h_{t-1} + dt_t x_t B_t,  y_t = C_t . h_t + D x_t,  A = -exp(A_log)
    out    = out_proj(y * silu(z))                                 (d -> h)
GPT-NeoX's parameter names and initialisation: in_proj and x_proj by init_method, out_proj by
output_layer_init_method (GPT-NeoX's Mamba configs use single_residual_scaled_normal), the
convolution as torch's default, dt_proj's weight uniform in +-dt_rank^-0.5 and its bias the
inverse softplus of a log-uniform step in [0.001, 0.1] (floored at 1e-4), A_log = log(1..n) in
every channel, D = 1. A and D enter the scan in fp32 (mamba_selective_fp32_params).

The scan (megatron/model/selective_scan.py) is the step-by-step reference unless
mamba_selective_scan_fusion asks for the fast one: mamba_ssm's CUDA kernel where it is installed
and the tensors are on a GPU, else the chunked torch scan. mamba_causal_conv_fusion takes
causal_conv1d's kernel where installed, else torch's convolution; mamba_inner_func_fusion asks
for both kernels (mamba_ssm's single fused block is not used: it would leave x_proj's output
unreduced under tensor parallelism). Decoding runs the torch paths. `describe` says which runs.

Tensor parallelism splits the d channels over the ranks (in_proj by column, value and gate
halves separately; the convolution, dt_proj, A_log and D by channel; x_proj and out_proj by
row). x_proj's partial products are summed over the ranks, so every rank computes dt, B and C
from all channels: the layer equals the one-process layer at any degree. (GPT-NeoX leaves
x_proj's output unreduced, so its layer changes with the tensor-parallel degree; its Mamba
configs run without tensor parallelism, where both agree.)

Incremental decoding keeps, per layer, the last 4 inputs of the convolution and the scan state
(`MambaState`) instead of keys and values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from megatron.model import selective_scan as scan
from megatron.model.config import CONV_WIDTH, STATE_SIZE, dt_rank
from megatron.model.init import init_methods, layer_generator
from megatron.model.mamba_paths import kernels, paths
from megatron.model.norms import build_norm
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import ColumnParallelLinear, RowParallelLinear, shard
from megatron.mpu.mappings import copy_to_tensor_parallel

DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4


@dataclass
class MambaState:
    """One Mamba layer's decoding state: the convolution's last inputs [b, d, 4] and the scan
    state [b, d, n] (fp32), this rank's channels."""

    conv: torch.Tensor | None = None
    ssm: torch.Tensor | None = None


class MambaMixer(nn.Module):
    """The selective state-space mixer: hidden [b, s, h] -> [b, s, h] (see the module docstring)."""

    def __init__(self, config, init_fn, out_init_fn, gen: torch.Generator,
                 tp: TensorParallel = NO_TP):
        super().__init__()
        h, d, r = config.hidden_size, config.mamba_inner_size, dt_rank(config.hidden_size)
        if d % tp.size:
            raise ValueError(f"Mamba channels ({d}) are not divisible by "
                             f"model_parallel_size({tp.size})")
        self.tp, self.config = tp, config
        self.dt_rank = r
        bias = config.mamba_use_bias_in_linears
        fp32 = config.fp32_products
        self.in_proj = ColumnParallelLinear(h, 2 * d, init_fn, gen, tp, bias=bias,
                                            stride_groups=2, fp32_products=fp32)
        local = d // tp.size
        self.conv1d = nn.Conv1d(local, local, CONV_WIDTH, groups=local,
                                padding=CONV_WIDTH - 1, bias=config.mamba_use_bias_in_conv)
        bound = 1.0 / math.sqrt(CONV_WIDTH)  # torch's default init, drawn from `gen`
        with torch.no_grad():
            self.conv1d.weight.copy_(shard(_uniform((d, 1, CONV_WIDTH), bound, gen), 0, tp))
            if self.conv1d.bias is not None:
                self.conv1d.bias.copy_(shard(_uniform((d,), bound, gen), 0, tp))
        self.x_proj = RowParallelLinear(d, r + 2 * STATE_SIZE, init_fn, gen, tp, bias=bias,
                                        fp32_products=fp32)
        self.dt_proj = nn.Linear(r, local, bias=True)
        dt = torch.exp(torch.rand(d, generator=gen) * (math.log(DT_MAX) - math.log(DT_MIN))
                       + math.log(DT_MIN)).clamp(min=DT_FLOOR)
        with torch.no_grad():
            self.dt_proj.weight.copy_(shard(_uniform((d, r), r ** -0.5, gen), 0, tp))
            self.dt_proj.bias.copy_(shard(dt + torch.log(-torch.expm1(-dt)), 0, tp))
        a = torch.arange(1, STATE_SIZE + 1, dtype=torch.float32).repeat(local, 1)
        self.A_log = nn.Parameter(torch.log(a))
        self.D = nn.Parameter(torch.ones(local))
        self.A_log._no_weight_decay = self.D._no_weight_decay = True  # GPT-NeoX's marks
        if config.mamba_selective_fp32_params:  # kept fp32 in bf16/fp16 runs (precision.py)
            self.A_log.keep_fp32 = self.D.keep_fp32 = True
        self.out_proj = RowParallelLinear(d, h, out_init_fn, gen, tp, bias=bias,
                                          fp32_products=fp32)
        if tp.enabled:
            for p in (self.conv1d.weight, self.conv1d.bias, self.dt_proj.weight,
                      self.dt_proj.bias, self.A_log, self.D):
                if p is not None:
                    p.tensor_model_parallel = True
        self._paths: dict[str, tuple[str, str]] = {}  # by device type

    def _path(self, device_type: str) -> tuple[str, str]:
        if device_type not in self._paths:
            self._paths[device_type] = paths(self.config, device_type)
        return self._paths[device_type]

    def forward(self, u: torch.Tensor, state: MambaState | None = None,
                keep: torch.Tensor | None = None) -> torch.Tensor:
        """u [b, s, h] -> [b, s, h]. With `state` (decoding), the convolution and the scan
        continue from it and it is updated; `keep` [b, s] (False at left padding) zeroes the
        padding's contribution so that a padded prompt leaves the state an unpadded one would."""
        xz = self.in_proj(u)  # [b, s, 2d/tp]
        x, z = xz.chunk(2, dim=-1)
        if keep is not None:
            x = x * keep.unsqueeze(-1).to(x.dtype)
        x, z = x.transpose(1, 2), z.transpose(1, 2)  # [b, d, s]
        weight, bias = self.conv1d.weight.squeeze(1), self.conv1d.bias
        scan_path, conv_path = self._path(x.device.type)
        kernel_scan, kernel_conv = kernels() if x.is_cuda else (None, None)
        if state is not None and state.conv is not None and x.shape[-1] == 1:
            x = scan.causal_conv1d_update(state.conv, x[..., 0], weight, bias).unsqueeze(-1)
        elif state is None and conv_path == "causal_conv1d kernel":
            x = kernel_conv(x.contiguous(), weight, bias, activation="silu")
        else:
            x, conv_state = scan.causal_conv1d(
                x, weight, bias, activation="silu", return_state=True,
                initial_state=None if state is None else state.conv)
            if state is not None:
                state.conv = conv_state
        if keep is not None:
            x = x * keep.unsqueeze(1).to(x.dtype)
        x_dbl = copy_to_tensor_parallel(self.x_proj(x.transpose(1, 2)), self.tp)  # [b, s, r+2n]
        dt, b_, c_ = torch.split(x_dbl, [self.dt_rank, STATE_SIZE, STATE_SIZE], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight).transpose(1, 2)  # [b, d, s], bias in the scan
        b_, c_ = b_.transpose(1, 2), c_.transpose(1, 2)  # [b, n, s]
        # the scans read [b, d, s] along s: contiguous rows are several times faster there
        dt, b_, c_, z = (t.contiguous() for t in (dt, b_, c_, z))
        a = -torch.exp(self.A_log.float())
        d_skip = self.D.float()
        if state is not None and state.ssm is not None and x.shape[-1] == 1:
            y = scan.selective_state_update(state.ssm, x[..., 0], dt[..., 0], a, b_[..., 0],
                                            c_[..., 0], d_skip, z[..., 0],
                                            dt_bias=self.dt_proj.bias).unsqueeze(-1)
        elif state is None and scan_path == "mamba_ssm selective_scan":
            y = kernel_scan(x.contiguous(), dt, a, b_, c_, d_skip, z, self.dt_proj.bias.float(),
                            True)
        else:
            method = "reference" if scan_path == "reference scan" else "chunked"
            out = scan.selective_scan(x, dt, a, b_, c_, d_skip, z, self.dt_proj.bias,
                                      delta_softplus=True, method=method,
                                      initial_state=None if state is None else state.ssm,
                                      return_state=state is not None)
            y = out
            if state is not None:
                y, state.ssm = out
        return self.out_proj(y.transpose(1, 2).to(u.dtype))


def _uniform(shape: tuple[int, ...], bound: float, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(shape, generator=gen).mul_(2 * bound).sub_(bound)


class MambaLayer(nn.Module):
    """x + mixer(norm(x)): GPT-NeoX's ParallelMambaResidualLayer (names `norm`, `mixer`)."""

    def __init__(self, config, layer_number: int, tp: TensorParallel = NO_TP):
        super().__init__()
        if tp.sequence_parallel:
            raise ValueError("sequence_parallel is not implemented for Mamba layers")
        self.layer_number = layer_number
        self.norm = build_norm(config)
        init_fn, out_init_fn = init_methods(config)
        self.mixer = MambaMixer(config, init_fn, out_init_fn,
                                layer_generator(config.seed, layer_number + 1), tp)

    def forward(self, x: torch.Tensor, position_ids=None, doc_mask=None,
                cache=None) -> torch.Tensor:
        # x: [b, s, h]; `cache` is this layer's LayerCache when decoding incrementally
        state = keep = None
        if cache is not None:
            state = cache.mamba_state()
            keep = cache.keep(x.shape[1])
        return x + self.mixer(self.norm(x), state, keep)


class MambaLayerPipe(MambaLayer):
    """A MambaLayer taking and returning the pipeline tuple (hidden, position_ids, mask)."""

    def forward(self, inputs):  # type: ignore[override]
        hidden, position_ids, mask = inputs
        return super().forward(hidden), position_ids, mask
