"""The dropless MoE layer: Mixtral's sparse block from transformers gives the same output with the
same weights; no assignment is dropped however skewed the routing; GPT-NeoX's Sinkhorn router
balances in training and takes the plain top-k at inference; the load-balancing loss equals
transformers' Mixtral loss; the auxiliary losses train the router as if added to the loss, at
the loss's gradient scale; layers follow GPT-NeoX's moe_expert_interval rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.model.config import ModelConfig
from megatron.model.gpt import GPTModel
from megatron.model.init import init_methods, layer_generator
from megatron.model.moe import (MoE, Router, aux_loss_scale, load_balancing_loss, router_z_loss,
                                sinkhorn)

H, FFN, E = 32, 48, 4


def config(**moe) -> ModelConfig:
    values = dict(num_layers=2, hidden_size=H, num_attention_heads=4, num_kv_heads=4,
                  intermediate_size=FFN, seq_length=12, max_position_embeddings=12,
                  padded_vocab_size=64, moe_num_experts=E, moe_top_k=2)
    return ModelConfig(**{**values, **moe})


def moe_layer(**moe) -> MoE:
    c = config(**moe)
    init_fn, out_init_fn = init_methods(c)
    return MoE(c, init_fn, out_init_fn, layer_generator(c.seed, 1))


def tokens(b=2, s=12, seed=0):
    return torch.randn(b, s, H, generator=torch.Generator().manual_seed(seed))


def naive(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token on its own: sum over its k experts of weight * expert(token)."""
    flat = x.reshape(-1, H)
    routing = moe.router(flat)
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for weight, e in zip(routing.weights[t], routing.experts[t]):
            hidden = moe.experts.activation(F.linear(flat[t], moe.experts.w_in[e]))
            out[t] += weight * F.linear(hidden, moe.experts.w_out[e])
    return out.view_as(x)


def test_equals_transformers_mixtral_sparse_block():
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = MixtralConfig(hidden_size=H, intermediate_size=FFN, num_local_experts=E,
                           num_experts_per_tok=2, router_jitter_noise=0.0)
    block = MixtralSparseMoeBlock(config).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    moe = moe_layer(activation="swiglu", moe_router_type="topk", moe_normalize_topk=True).eval()
    with torch.no_grad():
        moe.router.weight.copy_(block.gate.weight)
        gate, up = block.experts.gate_up_proj.chunk(2, dim=1)  # Mixtral: gate rows first
        moe.experts.w_in.copy_(torch.cat([up, gate], dim=1))  # ours: value rows, then gate
        moe.experts.w_out.copy_(block.experts.down_proj)
    x = tokens()
    ours = moe(x)
    theirs = block(x.clone())
    assert torch.allclose(ours, theirs, atol=1e-6)
    moe.train()
    moe(x).square().sum().backward()
    assert int(moe.take_stats().load.sum()) == 2 * 24
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in moe.parameters())


@pytest.mark.parametrize("router,k", [("topk", 1), ("topk", 2), ("sinkhorn", 2)])
def test_nothing_is_dropped_even_when_every_token_picks_one_expert(router, k):
    torch.manual_seed(0)
    moe = moe_layer(moe_top_k=k, moe_router_type=router).eval()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0  # with inputs of positive sum, expert 0 wins everywhere
    x = tokens().abs()
    out = moe(x)
    assert torch.allclose(out, naive(moe, x), atol=1e-5)
    moe.train()  # the topk router routes alike in training; the counts are kept then
    if router == "topk":
        moe(x)
        assert int(moe.take_stats().load[0]) == 24  # every token, no capacity


def test_sinkhorn_router_balances_in_training_and_takes_top_k_at_inference():
    router = Router(H, E, 2, "sinkhorn")
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, H, generator=torch.Generator().manual_seed(4)))
    # inputs leaning towards expert 0: plain top-2 sends every token there
    x = torch.randn(256, H, generator=torch.Generator().manual_seed(3)) + 0.5 * router.weight[0].detach()
    logits = F.linear(x, router.weight)
    probs = logits.softmax(-1)
    plain = torch.bincount(torch.topk(probs, 2).indices.reshape(-1), minlength=E)
    trained = router.train()(x)
    balanced = torch.bincount(trained.experts.reshape(-1), minlength=E)
    assert int(plain[0]) >= 240 and balanced.max() <= 0.75 * plain.max(), (plain, balanced)
    assert torch.equal(trained.experts, torch.topk(sinkhorn(logits), 2, dim=1).indices)
    assert torch.allclose(trained.weights, probs.gather(1, trained.experts))
    infer = router.eval()(x)
    assert torch.equal(infer.experts, torch.topk(probs, 2).indices)
    one = Router(H, E, 1, "sinkhorn").eval()  # k = 1: sigmoid scores, as GPT-NeoX
    routed = one(x)
    assert torch.allclose(routed.weights, torch.sigmoid(F.linear(x, one.weight)).max(-1,
                                                                                    keepdim=True).values)


def test_sinkhorn_evens_out_the_columns():
    cost = torch.randn(64, E, generator=torch.Generator().manual_seed(1)) * 3
    balanced = sinkhorn(cost, max_iter=50, tol=0)
    columns = balanced.sum(0)
    assert torch.allclose(columns, columns.mean().expand(E), rtol=1e-3)
    assert cost.exp().sum(0).std() / cost.exp().sum(0).mean() > 0.1


def test_load_balancing_loss_equals_transformers_mixtral_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    logits = torch.randn(40, E, generator=torch.Generator().manual_seed(2))
    experts = torch.topk(logits.softmax(-1), 2).indices
    assert torch.allclose(load_balancing_loss(logits, experts),
                          load_balancing_loss_func((logits,), E, top_k=2), atol=1e-6)
    uniform = load_balancing_loss(torch.zeros(8, E), torch.arange(8).remainder(E).view(8, 1))
    assert uniform.item() == pytest.approx(1.0)  # perfectly balanced top-1 routing
    assert router_z_loss(logits).item() == pytest.approx(
        (torch.logsumexp(logits, -1) ** 2).mean().item())


def test_jitter_only_in_training():
    router = Router(H, E, 2, "topk", jitter_eps=0.1)
    x = torch.randn(16, H)
    router.eval()
    assert torch.equal(router(x).logits, F.linear(x, router.weight))
    router.train()
    moved = router(x).logits - F.linear(x, router.weight)
    assert moved.abs().max() > 0


def test_bad_router_settings_are_named():
    with pytest.raises(ValueError, match="moe_top_k 5 must be between 1 and moe_num_experts 4"):
        Router(H, E, 5)
    with pytest.raises(ValueError, match="moe_router_type 'hash' is not known; valid: sinkhorn"):
        Router(H, E, 1, "hash")


def _grads(model, loss) -> dict:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("router", ["sinkhorn", "topk"])
def test_auxiliary_losses_train_the_router_as_if_added_to_the_loss(router):
    moe = moe_layer(moe_router_type=router, moe_aux_loss_coeff=0.1, moe_z_loss_coeff=0.01,
                    moe_lbl_in_fp32=True)
    x = tokens()
    target = tokens(seed=1)
    torch.manual_seed(0)
    got = _grads(moe, F.mse_loss(moe(x), target))
    # the same forward written out: the router's losses added to the loss by hand
    torch.manual_seed(0)
    plain = moe.coeffs
    moe.coeffs = (0.0, 0.0)
    routing = moe.router(x.reshape(-1, H))
    aux = (0.1 * load_balancing_loss(routing.logits, routing.experts)
           + 0.01 * router_z_loss(routing.logits))
    want = _grads(moe, F.mse_loss(moe(x), target) + aux)
    moe.coeffs = plain
    assert got.keys() == want.keys() == {"router.weight", "experts.w_in", "experts.w_out"}
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)
    without = moe_layer(moe_router_type=router)
    torch.manual_seed(0)
    assert not torch.allclose(_grads(without, F.mse_loss(without(x), target))["router.weight"],
                              got["router.weight"])
    # a loss whose gradient is scaled (1 / accumulation steps, fp16 loss scale): aux too
    torch.manual_seed(0)
    with aux_loss_scale(0.25):
        scaled = _grads(moe, 0.25 * F.mse_loss(moe(x), target))
    for name in got:
        torch.testing.assert_close(scaled[name], 0.25 * got[name], rtol=1e-5, atol=1e-8)


def test_moe_layers_follow_gpt_neox_interval_and_count_their_parameters():
    from megatron.model.param_count import count_parameters

    c = config(num_layers=4, moe_expert_interval=2)
    model = GPTModel(c)
    kinds = [type(layer.mlp).__name__ for layer in model.layers[1:5]]
    assert kinds == ["MoE", "MLP", "MoE", "MLP"]  # layers 0 and 2: i % interval == 0
    assert sum(p.numel() for p in model.parameters()) == count_parameters(c)
    dense = ModelConfig(**{**c.__dict__, "moe_num_experts": 1})
    # two layers, each: a router, E - 1 more MLP matrices, and not the dense MLP's biases
    assert count_parameters(c) - count_parameters(dense) == 2 * (
        E * H + (E - 1) * 2 * H * FFN - (FFN + H))


def test_stats_count_training_forwards_only_and_reset_when_read():
    moe = moe_layer(moe_router_type="topk")
    x = tokens()
    with torch.no_grad():
        moe.eval()(x)
        assert moe.take_stats() is None
        moe.train()
        moe(x)
        moe(x)
    stats = moe.take_stats()
    assert stats.forwards == 2 and int(stats.load.sum()) == 2 * 24 * 2
    routing = moe.router(x.reshape(-1, H))
    assert stats.balance_loss == pytest.approx(
        load_balancing_loss(routing.logits, routing.experts).item(), rel=1e-6)
    assert moe.take_stats() is None


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_grouped_product_equals_the_loop_over_experts_with_an_idle_expert(activation):
    from megatron.model.moe import grouped_gemm

    moe = moe_layer(activation=activation, moe_router_type="topk", intermediate_size=FFN)
    x = tokens()
    rows = torch.randn(30, H, generator=torch.Generator().manual_seed(7), requires_grad=True)
    counts = [12, 0, 10, 8]  # expert 1 gets nothing: its weights' gradient is zero
    assert grouped_gemm("cpu", torch.float32, H, FFN)
    grouped = moe.experts(rows, counts)
    grad = torch.randn(grouped.shape, generator=torch.Generator().manual_seed(8))
    got = torch.autograd.grad(grouped, (rows, moe.experts.w_in, moe.experts.w_out), grad)
    loop = torch.cat([moe.experts.activation(F.linear(r, moe.experts.w_in[e])) @
                      moe.experts.w_out[e].t() for e, r in enumerate(rows.split(counts))])
    want = torch.autograd.grad(loop, (rows, moe.experts.w_in, moe.experts.w_out), grad)
    torch.testing.assert_close(grouped, loop, rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    assert got[1][1].abs().sum() == 0
    assert not grouped_gemm("cpu", torch.bfloat16, H, FFN)  # the loop, with fp32 products
    assert not grouped_gemm("cpu", torch.float32, 30, FFN)  # rows not 16-byte aligned
    moe(x).sum().backward()  # an expanded gradient reaches the grouped product's backward


def test_moe_output_is_added_without_hidden_dropout_as_in_gpt_neox():
    """GPT-NeoX adds an MoE layer's output to the residual undropped (its dense MLP output goes
    through hidden dropout): with hidden_dropout 1 a training forward drops the attention
    output whole and keeps the experts' output whole."""
    from megatron.model.block import TransformerLayer

    c = config(hidden_dropout=1.0, moe_router_type="topk", moe_expert_interval=2)
    moe_block, dense_block = (TransformerLayer(c, i).train() for i in (0, 1))
    assert isinstance(moe_block.mlp, MoE) and not isinstance(dense_block.mlp, MoE)
    x = tokens()
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    with torch.no_grad():
        mlp_in = moe_block.post_attention_layernorm(x)
        torch.testing.assert_close(moe_block(x, positions), x + moe_block.mlp(mlp_in))
        torch.testing.assert_close(dense_block(x, positions), x)
