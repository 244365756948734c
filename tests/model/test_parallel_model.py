"""The whole GPT model split over 2 tensor-parallel gloo processes equals one process: logits,
loss and every gradient, for the architecture options that touch parallel code."""

import pytest
import torch

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel, lm_loss
from megatron.model.partition import Sharding, canonical_from_module
from megatron.mpu.groups import NO_TP, TensorParallel
from megatron.mpu.layers import sync_sequence_parallel_grads
from megatron.mpu.mappings import gather_from_tensor_parallel
from tests.distributed import run_distributed

ATOL = 2e-5  # fp32, different summation order only

VARIANTS = {
    "gqa_swiglu_rmsnorm": dict(num_kv_heads=2, activation="swiglu", norm="rmsnorm",
                               use_bias_in_attn_linear=False, use_bias_in_mlp=False),
    "tied_learned": dict(tied_embeddings=True, pos_emb="learned"),
    "local_attention_rotary_quarter": dict(attention_types=("local", "global"),
                                           sliding_window_width=3, rotary_pct=0.25),
    "gptj_alibi": dict(gpt_j_residual=True, pos_emb="alibi"),
    # experts split over the ranks, the router whole, its losses in the gradients
    "moe_sinkhorn_swiglu": dict(activation="swiglu", moe_num_experts=4, moe_top_k=2,
                                moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01),
    "moe_topk_interval2": dict(moe_num_experts=2, moe_top_k=1, moe_router_type="topk",
                               moe_expert_interval=2, moe_aux_loss_coeff=0.1),
    # Mamba channels split over the ranks, x_proj's partial products summed; one attention
    # layer among them; biases everywhere a Mamba layer can have one
    "mamba_hybrid": dict(attention_types=("mamba", "global"), mamba_inner_size=64,
                         norm="rmsnorm", pos_emb="none", mamba_use_bias_in_linears=True,
                         mamba_selective_scan_fusion=True),
}


def config(variant: str) -> ModelConfig:
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                intermediate_size=64, seq_length=8, max_position_embeddings=8,
                padded_vocab_size=64, init_method="normal", output_layer_init_method="scaled_normal")
    base.update(VARIANTS[variant])
    return ModelConfig(**base)


def _step(rank, world, variant, sequence_parallel):
    import torch.distributed as dist

    tp = NO_TP if world == 1 else TensorParallel(group=dist.group.WORLD, rank=rank, size=world,
                                                 sequence_parallel=sequence_parallel)
    model = GPTModel(config(variant), tp)
    sync_sequence_parallel_grads(model, tp)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 64, (2, 8), generator=g)
    labels = torch.randint(0, 64, (2, 8), generator=g)
    positions = torch.arange(8).expand(2, 8)
    logits = model(tokens, positions)
    loss = lm_loss(logits, (labels, torch.ones(2, 8)), tp)
    loss.backward()
    grads = canonical_from_module({n: p.grad for n, p in model.named_parameters()})
    return {"loss": loss.detach(), "logits": gather_from_tensor_parallel(logits.detach(), tp),
            "grads": grads}


def merged_grads(results, gated):
    names = results[0]["grads"]
    out = {}
    for name in names:
        layer, path = name.split(".", 1)
        out[name] = Sharding(gated).merge([{path: r["grads"][name]} for r in results])[path]
    return out


CASES = [(v, False) for v in sorted(VARIANTS)] + [("gqa_swiglu_rmsnorm", True)]


@pytest.mark.parametrize("variant,sequence_parallel", CASES,
                         ids=[f"{v}-{'sp' if sp else 'tp2'}" for v, sp in CASES])
def test_tensor_parallel_model_equals_one_process(variant, sequence_parallel):
    ref = _step(0, 1, variant, False)
    results = run_distributed(_step, 2, variant, sequence_parallel)
    gated = config(variant).activation == "swiglu"
    for r in results:
        assert torch.allclose(r["loss"], ref["loss"], atol=ATOL)
        assert torch.allclose(r["logits"], ref["logits"], atol=ATOL)
    grads = merged_grads(results, gated)
    assert grads.keys() == ref["grads"].keys()
    for name, expected in ref["grads"].items():
        assert torch.allclose(grads[name], expected, atol=ATOL), name


def test_canonical_state_round_trips_through_shards():
    """A tp2 model loaded from the canonical full weights of a one-process model is that model:
    Sharding.shard_model then Sharding.merge gives the canonical weights back."""
    from megatron.mpu.groups import TensorParallel

    c = config("gqa_swiglu_rmsnorm")
    full = canonical_from_module(GPTModel(c).state_dict())
    sharding = Sharding.for_model(c)
    assert sharding.gated_mlp
    shards = [sharding.shard_model(full, TensorParallel(rank=r, size=2)) for r in (0, 1)]
    for name, tensor in full.items():
        layer, path = name.split(".", 1)
        merged = sharding.merge([{path: s[f"layers.{name}"]} for s in shards])[path]
        assert torch.equal(merged, tensor), name
    assert shards[0]["layers.1.attention.query_key_value.weight"].shape[0] == \
        full["1.attention.query_key_value.weight"].shape[0] // 2
