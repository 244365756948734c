"""Which scan and convolution a Mamba layer runs (megatron/model/mamba.py): mamba_ssm's and
causal_conv1d's CUDA kernels where the fusion flags ask for them and they are installed, else
torch's. Without torch: deepy.py's memory estimate asks the same question before any worker
starts, and only a CUDA device imports the kernels' packages."""

from __future__ import annotations

import functools

from megatron.model.config import STATE_SIZE


@functools.cache
def kernels() -> tuple:
    """(mamba_ssm's selective_scan_fn, causal_conv1d's causal_conv1d_fn), None where not
    installed (looked up once: a failed import is not cached by Python)."""
    try:
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except ImportError:
        selective_scan_fn = None
    try:
        from causal_conv1d import causal_conv1d_fn
    except ImportError:
        causal_conv1d_fn = None
    return selective_scan_fn, causal_conv1d_fn


def paths(config, device_type: str) -> tuple[str, str]:
    """(scan, convolution) that run on `device_type` tensors under the config's fusion flags.

    mamba_inner_func_fusion asks for both kernels: mamba_ssm's single fused block is not used,
    as it would leave x_proj's output unreduced under tensor parallelism."""
    kernel_scan, kernel_conv = kernels() if device_type == "cuda" else (None, None)
    inner = config.mamba_inner_func_fusion
    if config.mamba_selective_scan_fusion or inner:
        scan_path = "mamba_ssm selective_scan" if kernel_scan is not None else "chunked torch scan"
    else:
        scan_path = "reference scan"
    conv_kernel = (config.mamba_causal_conv_fusion or inner) and kernel_conv is not None
    return scan_path, "causal_conv1d kernel" if conv_kernel else "torch conv1d"


def describe(config, device_type: str) -> str:
    """The startup line of a model with Mamba layers."""
    layers = [i for i in range(config.num_layers) if config.is_mamba_layer(i)]
    scan_path, conv_path = paths(config, device_type)
    asked = [k for k in ("mamba_selective_scan_fusion", "mamba_causal_conv_fusion",
                         "mamba_inner_func_fusion") if getattr(config, k)]
    return (f"mamba: {len(layers)} of {config.num_layers} layers, {config.mamba_inner_size} "
            f"channels, state {STATE_SIZE}; scan: {scan_path}, convolution: {conv_path}"
            + (f" ({', '.join(asked)} set)" if asked else " (no mamba_*_fusion flag set)"))
