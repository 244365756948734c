"""Every Triton kernel launch the fused paths make compiles for a Hopper GPU (sm_90: H100, H200)
on a machine without one. The kernels' arithmetic is checked against torch under Triton's
interpreter (test_triton_kernels.py), which accepts code the GPU compiler refuses; here each
launch the fused functions make, forward and backward, in fp32, bf16 and fp16, is compiled by
Triton's own compiler down to a cubin (ptxas included) with the same argument types, constants
and warp count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from megatron.model import fusions  # noqa: E402
from megatron.mpu.groups import NO_TP  # noqa: E402

KERNELS = ("_norm_fwd", "_norm_bwd", "_rotary", "_gated", "_bias_gelu", "_bias_dropout_add",
           "_ce_lse", "_ce_grad")
HOPPER = GPUTarget("cuda", 90, 32)
ROOT = Path(__file__).resolve().parents[2]
POINTER = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16",
           torch.int64: "*i64", torch.int32: "*i32"}


class Recording:
    """Stands for one kernel: records each launch's arguments, then runs the kernel."""

    def __init__(self, name, kernel, launches):
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.name, self.kernel, args, dict(kwargs)))
            return self.kernel[grid](*args, **kwargs)
        return launch


def signature(kernel, args, kwargs):
    """(signature, constexprs, options) of one launch, as Triton's launcher derives them."""
    jit = JITFunction(getattr(kernel, "fn", kernel))  # the interpreter's wraps the function
    options = {key: kwargs.pop(key) for key in ("num_warps", "num_stages") if key in kwargs}
    values = dict(zip(jit.arg_names, args)) | kwargs
    sig, constexprs = {}, {}
    for param in jit.params:
        value = values[param.name]
        if param.is_constexpr or value is None:
            sig[param.name], constexprs[param.name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[param.name] = POINTER[value.dtype]
        elif isinstance(value, bool):
            sig[param.name] = "i1"
        elif isinstance(value, int):
            sig[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
        else:
            sig[param.name] = "fp32"
    return sig, constexprs, options


def launches_of_every_fused_path(monkeypatch, dtype):
    """The kernel launches of each fused function's forward and backward on small CPU tensors
    (run through the interpreter), with the variants the model uses."""
    kernels = fusions.triton_kernels()
    launches = []
    for name in KERNELS:
        monkeypatch.setattr(kernels, name, Recording(name, getattr(kernels, name), launches))
    g = torch.Generator().manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_()

    def backward(out):
        out.float().sum().backward()

    with fusions.triton_on_cpu():
        x = leaf(6, 64)
        backward(kernels.norm(x, leaf(64), leaf(64), 1e-5, False))  # layernorm
        backward(kernels.norm(x, leaf(64), None, 1e-5, True))  # rmsnorm, no bias
        q = leaf(2, 5, 3, 32).transpose(1, 2)  # [b, heads, s, d] seen in a [b, s, heads, d] buffer
        cos, sin = (t.unsqueeze(1) for t in (torch.rand(2, 5, 16), torch.rand(2, 5, 16)))
        backward(kernels.rotary(q, cos, sin))
        for act in ("silu", "gelu", "relu"):
            backward(kernels.gated(leaf(6, 128), act))
        backward(kernels.bias_gelu(leaf(6, 64), leaf(64)))
        backward(kernels.bias_gelu(leaf(6, 64), None))
        backward(kernels.bias_dropout_add(leaf(6, 64), leaf(64), leaf(6, 64), 0.1))
        backward(kernels.bias_dropout_add(leaf(6, 64), None, leaf(6, 64), 0.1))
        labels = torch.randint(0, 5000, (6,), generator=g)
        backward(fusions.cross_entropy(leaf(6, 5000), labels, NO_TP))
    return launches


def compile_for_hopper(launches: list) -> list:
    """Compile each (kernel name, signature, constexprs, options) for sm_90; run in a process
    without the interpreter (which leaves triton.language patched after a kernel calls a jit
    function, such as _gated's activation, and the compiler then fails)."""
    from megatron.model import triton_kernels

    done = []
    for name, sig, constexprs, options in launches:
        binary = triton.compile(
            ASTSource(fn=getattr(triton_kernels, name), signature=sig, constexprs=constexprs),
            target=HOPPER, options=options)
        done.append({"kernel": name, "cubin_bytes": len(binary.asm["cubin"]),
                     "sm_90": ".target sm_90" in binary.asm["ptx"]})
    return done


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])
def test_every_kernel_launch_compiles_for_hopper(monkeypatch, dtype):
    launches = launches_of_every_fused_path(monkeypatch, dtype)
    assert {name for name, *_ in launches} == set(KERNELS)
    distinct = {}
    for name, kernel, args, kwargs in launches:
        sig, constexprs, options = signature(kernel, args, kwargs)
        distinct[json.dumps([name, sig, constexprs, options], sort_keys=True)] = None
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json, sys; from tests.model.test_triton_compile import compile_for_hopper; "
            "print(json.dumps(compile_for_hopper(json.loads(sys.stdin.read()))))")
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(
        [json.loads(key) for key in distinct]), capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    compiled = json.loads(proc.stdout.splitlines()[-1])
    assert all(c["cubin_bytes"] > 0 and c["sm_90"] for c in compiled), compiled
    # forward and backward of every kernel, and the constant variants (norm kind, bias or
    # not, activation, the cross entropy's vocabulary size) each compiled as its own program
    assert {c["kernel"] for c in compiled} == set(KERNELS)
    assert len(compiled) >= 16, compiled
