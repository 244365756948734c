"""torch_compile: the transformer layers through torch.compile train as the eager layers do (real
DeepSpeed engines in gloo processes, inductor's C++ kernels on CPU), share one compiled graph,
replay dropout under activation recompute, and the settings that cannot run are refused."""

from __future__ import annotations

import pytest
import torch

from megatron.model.compile import check_supported, describe
from tests.distributed import run_distributed

STEPS = 3
NO_DROPOUT = dict(hidden_dropout=0.0, attention_dropout=0.0)


def _train(rank, world, tmp, runs):
    """For each overrides dict in `runs`: a fresh engine (same seed), STEPS steps; its losses,
    the graphs dynamo compiled while building and training it, and the compile line logged."""
    import logging
    from pathlib import Path

    from megatron.model.compile import graphs_compiled
    from tests.checkpointing.engines import build, make_args, train

    out = []
    for overrides in runs:
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger("megatron").setLevel(logging.INFO)
        logging.getLogger("megatron").addHandler(handler)
        before = graphs_compiled()
        args = make_args(Path(tmp), **overrides)
        engine = build(args)
        losses = train(engine, args, STEPS)
        logging.getLogger("megatron").removeHandler(handler)
        lines = [r.getMessage() for r in records if r.getMessage().startswith("torch_compile")]
        out.append({"losses": losses, "graphs": graphs_compiled() - before, "lines": lines})
    return out


def test_compiled_layers_train_as_eager_ones_in_a_pipeline_and_with_recompute(tmp_path):
    """Three steps of the 2-layer test model: eager, compiled as a one-stage pipeline, and
    compiled as a plain module with activation checkpointing give the same losses (fp32; the
    compiled kernels sum in another order). Both layers share one compiled graph."""
    eager, piped, recomputed = run_distributed(_train, 1, str(tmp_path), [
        dict(NO_DROPOUT),
        dict(NO_DROPOUT, torch_compile=True),
        dict(NO_DROPOUT, torch_compile=True, pipe_parallel_size=0, checkpoint_activations=True),
    ])[0]
    assert eager["graphs"] == 0 and eager["lines"] == []
    assert piped["graphs"] == 1, piped
    # one more: the checkpointed forward runs without grad; the recompute (with grad) reuses
    # the pipeline run's graph, as engines in one process share what dynamo compiled
    assert recomputed["graphs"] == 1, recomputed
    assert piped["lines"] == recomputed["lines"] == [describe(2, 0)]
    assert eager["losses"][-1] < eager["losses"][0]  # it trains: the steps change the weights
    torch.testing.assert_close(piped["losses"], eager["losses"], rtol=1e-5, atol=0)
    torch.testing.assert_close(recomputed["losses"], eager["losses"], rtol=1e-5, atol=0)


def test_compiled_dropout_is_replayed_by_activation_recompute(tmp_path):
    """With dropout the compiled layers draw their masks from torch's generator: a run with
    activation checkpointing (the masks drawn again in the recompute) equals one without, and
    differs from a run without dropout (the masks act)."""
    plain, recomputed, undropped = run_distributed(_train, 1, str(tmp_path), [
        dict(torch_compile=True, pipe_parallel_size=0, hidden_dropout=0.1),
        dict(torch_compile=True, pipe_parallel_size=0, hidden_dropout=0.1,
             checkpoint_activations=True),
        dict(torch_compile=True, pipe_parallel_size=0, hidden_dropout=0.0),
    ])[0]
    torch.testing.assert_close(recomputed["losses"], plain["losses"], rtol=1e-5, atol=0)
    assert abs(plain["losses"][-1] - undropped["losses"][-1]) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    dict(model_parallel_size=2, sequence_parallel=True),
    dict(pipe_parallel_size=2),
], ids=["tp2-sequence-parallel", "pp2"])
def test_compiled_layers_under_tensor_sequence_and_pipeline_parallelism(tmp_path, layout):
    """2 tensor-parallel ranks with sequence parallelism (the layers' all-gathers and
    reduce-scatters inside the compiled graph), or 2 pipeline stages of one layer each: the
    compiled layers train as the eager ones."""
    results = run_distributed(_train, 2, str(tmp_path), [
        dict(NO_DROPOUT, **layout),
        dict(NO_DROPOUT, **layout, torch_compile=True),
    ])
    for eager, compiled in results:
        assert compiled["graphs"] == 1, compiled
        torch.testing.assert_close(compiled["losses"], eager["losses"], rtol=1e-5, atol=0)


def test_a_model_with_moe_layers_compiles_its_dense_layers_and_trains_as_eager(tmp_path):
    """Every other layer an MoE layer: the dense ones compile, the MoE ones run eager, and the
    losses are the eager model's."""
    moe = dict(NO_DROPOUT, moe_num_experts=2, moe_expert_interval=2)
    eager, compiled = run_distributed(_train, 1, str(tmp_path), [
        moe, dict(moe, torch_compile=True)])[0]
    assert compiled["lines"] == [describe(1, 1)]
    torch.testing.assert_close(compiled["losses"], eager["losses"], rtol=1e-5, atol=0)


def test_moe_layers_stay_eager():
    """Only dense transformer layers compile: an MoE layer's token dispatch has data-dependent
    shapes. The start-up line counts both."""
    from megatron.model.compile import compile_layers
    from megatron.model.config import ModelConfig
    from megatron.model.gpt import GPTModel

    config = ModelConfig(num_layers=4, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                         intermediate_size=64, seq_length=8, max_position_embeddings=8,
                         padded_vocab_size=64, moe_num_experts=2, moe_expert_interval=2)
    model = GPTModel(config)
    assert compile_layers(model) == (2, 2)
    assert describe(2, 2).endswith("; 2 MoE or Mamba layer(s) run eager")


def test_layers_of_several_kinds_raise_dynamos_recompile_limit():
    """Global, local and flash-windowed layers share one forward function: dynamo may compile
    GRAPHS_PER_KIND graphs for each kind before it would fall back to eager."""
    import torch._dynamo

    from megatron.model.compile import GRAPHS_PER_KIND, compile_layers
    from megatron.model.config import ModelConfig
    from megatron.model.gpt import GPTModel

    # saved and set back by hand: monkeypatch's undo deletes the key, which hides it from
    # dynamo's config, and every later torch.compile in the process then fails
    saved, torch._dynamo.config.recompile_limit = torch._dynamo.config.recompile_limit, 8
    config = ModelConfig(num_layers=3, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                         intermediate_size=64, seq_length=8, max_position_embeddings=8,
                         padded_vocab_size=64, attention_types=("global", "local", "flash"),
                         sliding_window_width=3)
    try:
        assert compile_layers(GPTModel(config)) == (3, 0)
        assert torch._dynamo.config.recompile_limit == 3 * GRAPHS_PER_KIND == 12
    finally:
        torch._dynamo.config.recompile_limit = saved


def test_bf16_and_fp16_without_a_gpu_are_refused_by_name():
    check_supported(True, "fp32", on_cuda=False)
    check_supported(True, "bf16", on_cuda=True)
    check_supported(False, "bf16", on_cuda=False)
    for precision in ("bf16", "fp16"):
        with pytest.raises(ValueError, match=f"torch_compile: true with {precision} needs a "
                                             "CUDA GPU.*Train in fp32 on CPU, or set "
                                             "torch_compile: false"):
            check_supported(True, precision, on_cuda=False)
