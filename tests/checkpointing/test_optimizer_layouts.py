"""Optimizer state layouts as objects: each detects its optimizer, state is carried exactly as
the optimizer registry declares it (never dropped), and a DeepSpeed without the internals we
read is named with its version."""

import pytest
import torch

from megatron.checkpointing import optimizer_layouts
from megatron.checkpointing.errors import CheckpointMismatchError
from megatron.checkpointing.reshard import FullState, _check_state_keys
from megatron.training.optimizers import build_optimizer, state_keys


def test_a_plain_torch_optimizer_is_the_torch_layout():
    model = torch.nn.Linear(4, 4)
    for kind in ("adam", "sgd"):
        optimizer = build_optimizer(model, kind, {"lr": 0.1, "momentum": 0.9} if kind == "sgd"
                                    else {"lr": 0.1}, 0.0)
        layout = optimizer_layouts.detect(optimizer)
        assert layout.name == "torch"
        assert [len(g) for g in layout.groups(optimizer)] == [1, 1]  # decay, no decay
    assert optimizer_layouts.detect(None).name == "none"
    assert optimizer_layouts.by_name("zero3").name == "zero3"


def test_the_registry_declares_each_optimizers_state_and_torch_keeps_exactly_that():
    assert state_keys("Adam", {}) == state_keys("adamw", {}) == ("exp_avg", "exp_avg_sq")
    assert state_keys("sgd", {"momentum": 0.9}) == ("momentum_buffer",)
    assert state_keys("sgd", {}) == ()
    model = torch.nn.Linear(4, 4)
    for kind, params in (("adam", {"lr": 0.1}), ("sgd", {"lr": 0.1, "momentum": 0.9})):
        optimizer = build_optimizer(model, kind, params, 0.0)
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        kept = {k for s in optimizer.state.values() for k, v in s.items()
                if isinstance(v, torch.Tensor) and k != "step"}
        assert kept == set(state_keys(kind, params))


def test_state_the_optimizer_does_not_declare_is_refused_by_name():
    values = {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}
    assert optimizer_layouts._declared(values, ("exp_avg", "exp_avg_sq"), "f.pt").keys() == {
        "exp_avg", "exp_avg_sq"}
    with pytest.raises(CheckpointMismatchError, match=r"f.pt \(1.weight\): the optimizer state "
                       r"holds momentum_buffer, which the optimizer that saved it does not "
                       r"declare \(declared: exp_avg, exp_avg_sq\); resharding would lose it"):
        optimizer_layouts._declared({"momentum_buffer": torch.zeros(2)},
                                    ("exp_avg", "exp_avg_sq"), "f.pt (1.weight)")
    with pytest.raises(CheckpointMismatchError, match=r"lacks exp_avg_sq"):
        optimizer_layouts._declared({"exp_avg": torch.zeros(2)}, ("exp_avg", "exp_avg_sq"), "f")
    assert optimizer_layouts._declared({}, ("exp_avg",), "f") == {}  # not stepped yet


def test_another_optimizers_state_is_refused_not_dropped():
    full = FullState(weights={}, state={"1.weight": {"exp_avg": torch.zeros(1),
                                                     "exp_avg_sq": torch.zeros(1)}},
                     state_keys=("exp_avg", "exp_avg_sq"))
    _check_state_keys(full, ("exp_avg", "exp_avg_sq"))
    with pytest.raises(CheckpointMismatchError, match=r"the checkpoint holds exp_avg, exp_avg_sq, "
                       r"which this run's optimizer does not keep; this run's optimizer needs "
                       r"momentum_buffer, which the checkpoint does not hold. Use the optimizer "
                       r"the checkpoint was trained with, or no_load_optim=true"):
        _check_state_keys(full, ("momentum_buffer",))


def test_a_missing_deepspeed_internal_names_both_versions():
    import deepspeed

    with pytest.raises(RuntimeError, match=rf"DeepSpeed {deepspeed.__version__} has no "
                       r"Linear.fp16_groups: checkpoint saving, resharding and log_grad_norm "
                       r"read DeepSpeed 0.19.x optimizer internals. Install "
                       r"deepspeed>=0.19,<0.20"):
        optimizer_layouts.Zero3Layout().groups(torch.nn.Linear(2, 2))
