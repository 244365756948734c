"""What this machine and its torch offer, found without importing torch where that settles the
question: importing torch takes seconds, which `deepy.py` would otherwise spend before starting
any worker. A leaf module."""

from __future__ import annotations

import ast
import contextlib
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


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
