"""Activation checkpointing through DeepSpeed gives the loss and gradients of the plain model,
with dropout on, for one layer or two per checkpoint, at tp1 and at tp2 (with and without
partitioned activations), on real gloo processes."""

from types import SimpleNamespace

import pytest
import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel, lm_loss
from megatron.model.partition import canonical_from_module
from tests.distributed import run_distributed

ATOL = 1e-6  # the recompute repeats the same fp32 operations

CONFIG = ModelConfig(num_layers=3, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                     intermediate_size=64, seq_length=8, max_position_embeddings=8,
                     padded_vocab_size=64, hidden_dropout=0.2, attention_dropout=0.2)


FUSED_FLAGS = ("layernorm_fusion", "rope_fusion", "bias_gelu_fusion", "bias_dropout_fusion")


def parallelism(**overrides) -> SimpleNamespace:
    """The parallelism section's activation checkpointing keys."""
    keys = dict(checkpoint_activations=True, checkpoint_num_layers=1,
                partition_activations=False, contiguous_checkpointing=False,
                checkpoint_in_cpu=False, synchronize_each_layer=False, pipe_parallel_size=0)
    return SimpleNamespace(**{**keys, **overrides})


def _steps(rank, world, par, fused=False):
    """Two micro-batches of forward and backward (dropout draws continue across them);
    returns each loss and the summed gradients. `fused`: every fusion flag on, the Triton
    kernels interpreted on CPU tensors (their dropout masks drawn from torch's generator)."""
    import contextlib
    import dataclasses

    from megatron.model.fusions import triton_on_cpu
    from megatron.model.recompute import Recompute, configure_activation_checkpointing
    from megatron.mpu.deepspeed_adapter import DeepSpeedMPU
    from megatron.mpu.groups import ProcessGroups
    from megatron.mpu.initialize import disable_deepspeed_shm_allreduce
    from megatron.mpu.topology import Topology

    import deepspeed

    disable_deepspeed_shm_allreduce()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    groups = ProcessGroups.build(Topology(tp=world, pp=1, dp=1))
    tp = groups.tensor_parallel(seed=1234)
    recompute = None
    if par is not None:
        configure_activation_checkpointing(par, CONFIG.num_layers, DeepSpeedMPU(groups))
        recompute = Recompute(par.checkpoint_num_layers, tp)
    config = CONFIG
    if fused:
        config = dataclasses.replace(CONFIG, **{flag: True for flag in FUSED_FLAGS})
    torch.manual_seed(1234)
    model = GPTModel(config, tp, recompute).train()
    g = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(2):
        tokens = torch.randint(0, 64, (2, 8), generator=g)
        labels = torch.randint(0, 64, (2, 8), generator=g)
        with triton_on_cpu() if fused else contextlib.nullcontext():
            loss = lm_loss(model(tokens, torch.arange(8).expand(2, 8)), (labels, torch.ones(2, 8)),
                           tp)
            loss.backward()
        losses.append(loss.detach())
    return {"losses": losses,
            "grads": canonical_from_module({n: p.grad for n, p in model.named_parameters()})}


def assert_same(results, reference):
    for got, want in zip(results, reference):
        for a, b in zip(got["losses"], want["losses"]):
            assert torch.allclose(a, b, atol=ATOL)
        assert got["grads"].keys() == want["grads"].keys()
        for name, grad in want["grads"].items():
            assert torch.allclose(got["grads"][name], grad, atol=ATOL), name


def test_dropout_differs_between_steps():
    """The comparison means something: dropout is on, so the two micro-batches' masks differ
    from a run without dropout."""
    [with_dropout] = run_distributed(_steps, 1, None)
    assert with_dropout["losses"][0].item() != with_dropout["losses"][1].item()


@pytest.mark.parametrize("layers", [1, 2])
def test_checkpointing_equals_plain_model_tp1(layers):
    reference = run_distributed(_steps, 1, None)
    assert_same(run_distributed(_steps, 1, parallelism(checkpoint_num_layers=layers)), reference)


CASES = {
    "ckpt": parallelism(),
    "ckpt-2-layers": parallelism(checkpoint_num_layers=2),
    "partition": parallelism(partition_activations=True),
    "partition-contiguous-cpu-sync": parallelism(partition_activations=True,
                                                 contiguous_checkpointing=True,
                                                 checkpoint_in_cpu=True,
                                                 synchronize_each_layer=True),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpointing_equals_plain_model_tp2(case):
    reference = run_distributed(_steps, 2, None)
    assert_same(run_distributed(_steps, 2, CASES[case]), reference)


def test_checkpointing_with_the_triton_kernels_equals_plain_model_tp2():
    """The fused dropout's masks come from torch's generator, which the recompute restores."""
    reference = run_distributed(_steps, 2, None, True)
    assert_same(run_distributed(_steps, 2, parallelism(), True), reference)
    plain = run_distributed(_steps, 2, None)
    assert plain[0]["losses"][0].item() != reference[0]["losses"][0].item()
