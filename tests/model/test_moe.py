"""The dropless MoE layer: Mixtral's sparse block from transformers gives the same output with the
same weights; no assignment is dropped however skewed the routing; GPT-NeoX's Sinkhorn router
balances in training and takes the plain top-k at inference; the load-balancing loss equals
transformers' Mixtral loss."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from megatron.model.moe import DroplessMoE, Router, load_balancing_loss, router_z_loss, sinkhorn

H, FFN, E = 32, 48, 4


def tokens(b=2, s=12, seed=0):
    return torch.randn(b, s, H, generator=torch.Generator().manual_seed(seed))


def naive(moe: DroplessMoE, x: torch.Tensor) -> torch.Tensor:
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
    moe = DroplessMoE(H, FFN, E, 2, "swiglu", router="topk", normalize=True).eval()
    with torch.no_grad():
        moe.router.weight.copy_(block.gate.weight)
        gate, up = block.experts.gate_up_proj.chunk(2, dim=1)  # Mixtral: gate rows first
        moe.experts.w_in.copy_(torch.cat([up, gate], dim=1))  # ours: value rows, then gate
        moe.experts.w_out.copy_(block.experts.down_proj)
    x = tokens()
    ours, stats = moe(x)
    theirs = block(x.clone())
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert int(stats.load.sum()) == 2 * 24
    ours.square().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in moe.parameters())


@pytest.mark.parametrize("router,k", [("topk", 1), ("topk", 2), ("sinkhorn", 2)])
def test_nothing_is_dropped_even_when_every_token_picks_one_expert(router, k):
    torch.manual_seed(0)
    moe = DroplessMoE(H, FFN, E, k, "gelu", router=router).eval()
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0] = 1.0  # with inputs of positive sum, expert 0 wins everywhere
    x = tokens().abs()
    out, stats = moe(x)
    assert int(stats.load[0]) == 24  # every token, no capacity
    assert torch.allclose(out, naive(moe, x), atol=1e-5)


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
