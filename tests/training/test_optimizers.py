"""The optimizers `optimizer: {type, params}` builds (megatron/training/optimizers.py), against
the update formulas of GPT-NeoX's: FusedAdam in AdamW mode (decoupled weight decay) or, with
`adam_w_mode: false`, with the decay added to the gradient; weight decay only on matrices."""

from __future__ import annotations

import pytest
import torch

from megatron.training.optimizers import build_optimizer


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3)


def one_step(kind: str, params: dict, weight_decay: float, grad: float = 0.0) -> dict:
    """Weights before and after one step with every gradient equal to `grad`."""
    model = Tiny()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    optimizer = build_optimizer(model, kind, params, weight_decay)
    for p in model.parameters():
        p.grad = torch.full_like(p, grad)
    optimizer.step()
    return before, dict(model.named_parameters())


def test_matrices_decay_and_biases_and_norm_weights_do_not():
    groups = build_optimizer(Tiny(), "adam", {"lr": 0.1}, 0.1).param_groups
    decays = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    model_params = dict(Tiny().named_parameters())
    assert len(decays) == len(model_params) == 4
    by_shape = sorted((len(g["params"][0].shape), g["weight_decay"]) for g in groups)
    assert by_shape == [(1, 0.0), (2, 0.1)]
    assert [len(g["params"]) for g in groups] == [1, 3]  # linear.weight; linear.bias, norm w, b


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_decays_decoupled_as_fused_adam_in_adamw_mode(kind):
    """Zero gradient: the moments stay 0, so the step is the decay alone, W(1 - lr wd)."""
    lr, wd = 0.01, 0.1
    before, after = one_step(kind, {"lr": lr}, wd)
    torch.testing.assert_close(after["linear.weight"], before["linear.weight"] * (1 - lr * wd),
                               rtol=0, atol=1e-7)
    for name in ("linear.bias", "norm.weight", "norm.bias"):
        assert torch.equal(after[name], before[name]), name


def test_adam_w_mode_false_adds_the_decay_to_the_gradient():
    """FusedAdam with adam_w_mode false: g' = g + wd W, then Adam; with g = 0 the first step
    is lr * g'/(|g'| + eps) = lr * sign(W) (to within eps)."""
    lr, wd = 0.01, 0.1
    before, after = one_step("adam", {"lr": lr, "adam_w_mode": False, "eps": 1e-8}, wd)
    w = before["linear.weight"]
    g = wd * w
    expected = w - lr * g / (g.abs() + 1e-8)
    torch.testing.assert_close(after["linear.weight"], expected, rtol=0, atol=1e-6)
    assert not torch.allclose(after["linear.weight"], w * (1 - lr * wd))


def test_sgd_momentum_dampening_and_nesterov_follow_torch():
    params = {"lr": 0.1, "momentum": 0.9, "dampening": 0.5}
    model = Tiny()
    reference = Tiny()
    ours = build_optimizer(model, "sgd", params, 0.0)
    theirs = torch.optim.SGD(reference.parameters(), **params)
    for step in range(3):
        for m in (model, reference):
            for p in m.parameters():
                p.grad = torch.full_like(p, 1.0 + step)
        ours.step()
        theirs.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    # dampening took effect: without it the weights differ
    plain = Tiny()
    undamped = build_optimizer(plain, "sgd", {"lr": 0.1, "momentum": 0.9}, 0.0)
    for step in range(3):
        for p in plain.parameters():
            p.grad = torch.full_like(p, 1.0 + step)
        undamped.step()
    assert not torch.equal(plain.linear.weight, model.linear.weight)
