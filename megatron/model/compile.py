"""`torch_compile`: the dense transformer layers of a training run through torch.compile.

Each `TransformerLayer` that is not an MoE layer is compiled in place (`module.compile()`,
torch's regional compilation): dynamo traces the layer's forward once and inductor generates
fused kernels for it and for its backward. Layers of the same shape share the compiled code, so
a model of identical layers compiles one graph whatever its depth (a graph more for each other
attention type, window or mode such as eval). What this buys is fewer, larger kernels: the
norms, rotary, bias, activation and residual ops of a layer fuse, and a GPU spends less host time
launching them, which is what bounds small models there.

Inside a compiled layer the fusion flags' Triton kernels are not called (`fusions.use_triton`
answers False while dynamo traces), since inductor fuses the same ops itself; what a flag
means for the model stays (bias_gelu_fusion's tanh GELU, for instance). The exception is
rope_fusion's rotary kernel, which runs there as the operator `neox::rotary` that inductor
calls as it is: inductor's own rotary, fused with the read of the queries from the QKV output,
took 1.1 ms a layer on an H200 at 1-3B (8% of the step). MoE layers (their
token dispatch has data-dependent shapes) and Mamba layers run eager, as do generation and
evaluation, which build their own models.

On CPU tensors only fp32 compiles: torch 2.13's inductor writes C++ for one bf16 reduction in the
layer's backward that the compiler rejects ("conflicting declaration"), so `check_supported`
refuses bf16 and fp16 without a GPU before any worker starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # deepy.py checks the key before any worker starts, without importing torch
    from torch import nn


def check_supported(enabled: bool, precision: str, on_cuda: bool) -> None:
    """ValueError where `torch_compile: true` cannot run: bf16/fp16 on a machine without a GPU."""
    if enabled and precision in ("bf16", "fp16") and not on_cuda:
        raise ValueError(
            f"torch_compile: true with {precision} needs a CUDA GPU: on CPU tensors torch's "
            "inductor fails to build the compiled layers' backward in bf16/fp16 (a C++ "
            "'conflicting declaration' error). Train in fp32 on CPU, or set torch_compile: false")


# graphs one kind of layer can need: training, the no-grad forward of activation checkpointing,
# evaluation, and a shape-generic graph where a batch of another size comes
GRAPHS_PER_KIND = 4


def compile_layers(model: nn.Module) -> tuple[int, int]:
    """Compile each dense transformer layer of `model` in place; (layers compiled, transformer
    and Mamba layers left eager).

    All layers run one forward function, and dynamo compiles at most `recompile_limit` graphs
    (8 by default) for a function before running it eager: where the layers differ in kind
    (attention type and window), the limit is raised to GRAPHS_PER_KIND graphs per kind."""
    import torch._dynamo

    from megatron.model.block import TransformerLayer
    from megatron.model.fusions import triton_kernels
    from megatron.model.mamba import MambaLayer

    # the kernel module (and the rotary operator it registers) is imported now, eagerly: its
    # first use is otherwise inside a layer, while dynamo traces it
    triton_kernels()
    compiled, eager, kinds = 0, 0, set()
    for module in model.modules():
        if isinstance(module, TransformerLayer) and not module.moe:
            module.compile()
            compiled += 1
            kinds.add((module.attention.attention_type, module.attention.window))
        elif isinstance(module, (TransformerLayer, MambaLayer)):
            eager += 1
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, GRAPHS_PER_KIND * len(kinds))
    return compiled, eager


def describe(compiled: int, eager: int) -> str:
    """The start-up line for a run with torch_compile: true."""
    line = (f"torch_compile: {compiled} transformer layer(s) run through torch.compile "
            "(inductor), compiled in the first step; inside them inductor's fused kernels "
            "replace the fusion flags' Triton kernels, all but the rotary")
    if eager:
        line += f"; {eager} MoE or Mamba layer(s) run eager"
    return line


def graphs_compiled() -> int:
    """How many graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
