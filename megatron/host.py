"""What this machine and its torch offer, found without importing torch where that settles the
question: importing torch takes seconds, which `deepy.py` would otherwise spend before starting
any worker. A leaf module."""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib.util
import os
from pathlib import Path

GPU_BACKENDS = ("cuda", "hip", "xpu")  # the constants torch/version.py names for its GPU builds


def cpu_only_build() -> bool:
    """Whether the installed torch was built without CUDA, ROCm and XPU, from the constants its
    build wrote to torch/version.py. False when the file cannot be read or lacks one of them:
    the caller then asks torch itself."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(
            encoding="utf-8")
    except OSError:
        return False
    return no_gpu_backend(text)


def no_gpu_backend(version_py: str) -> bool:
    """Whether torch/version.py's text sets each of GPU_BACKENDS, each to None."""
    try:
        tree = ast.parse(version_py)
    except (SyntaxError, ValueError):
        return False
    values = {}
    for node in tree.body:
        target = (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1
                  else node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and node.value is not None:
            with contextlib.suppress(ValueError):
                values[target.id] = ast.literal_eval(node.value)
    return all(name in values for name in GPU_BACKENDS) and not any(
        values[name] for name in GPU_BACKENDS)


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch for a build that has no GPU backend."""
    if cpu_only_build():
        return False
    import torch

    return torch.cuda.is_available()


def check_precision_supported(precision: str) -> None:
    """fp16 needs CUDA: DeepSpeed's CPU accelerator has none (ValueError saying what to use)."""
    if precision == "fp16" and not cuda_available():
        raise ValueError("fp16 training needs a CUDA GPU: DeepSpeed's CPU accelerator has no fp16 "
                         "support. On CPU use bf16 ('bf16: {enabled: true}', fast on CPUs with "
                         "AMX) or fp32 (remove the fp16 section)")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, as /proc/cpuinfo lists them (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def fp32_products(setting: str) -> bool:
    """Whether `cpu_matmul_precision: <setting>` multiplies bf16 operands on CPU as fp32
    (megatron/mpu/products.py). `auto` before a run has timed the two (as `deepy.py`'s memory
    estimate sees it): fp32 unless the CPU has AMX tiles for bf16; the workers replace it with
    what they measure (products.measured_choice)."""
    if setting == "auto":
        return "amx_bf16" not in cpu_flags()
    if setting in ("fp32", "native"):
        return setting == "fp32"
    raise ValueError(f"cpu_matmul_precision must be auto, fp32 or native, not {setting!r}")


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
