"""The LR schedule: warmup, each decay style, the floor, and the scheduler's state round trip."""

import math

import pytest
import torch

from megatron.training.learning_rates import AnnealingLR, Schedule, learning_rate


def test_warmup_is_linear_to_the_peak():
    s = Schedule(lr=1.0, min_lr=0.1, warmup_iters=10, decay_iters=100, style="cosine")
    assert learning_rate(0, s) == pytest.approx(0.1)
    assert learning_rate(4, s) == pytest.approx(0.5)
    assert learning_rate(9, s) == pytest.approx(1.0)


@pytest.mark.parametrize("style,mid", [("linear", 0.55), ("cosine", 0.55), ("constant", 1.0)])
def test_decay_styles_midpoint_and_floor(style, mid):
    s = Schedule(lr=1.0, min_lr=0.1, warmup_iters=0, decay_iters=100, style=style)
    assert learning_rate(50, s) == pytest.approx(mid)
    end = learning_rate(100, s)
    assert end == pytest.approx(1.0 if style == "constant" else 0.1)
    assert learning_rate(10_000, s) == pytest.approx(end)  # never below the floor / past the end


def test_cosine_shape():
    s = Schedule(lr=2.0, min_lr=0.0, warmup_iters=0, decay_iters=40, style="cosine")
    assert learning_rate(10, s) == pytest.approx(1.0 + math.cos(math.pi / 4))


def test_unknown_style_lists_the_valid_ones():
    with pytest.raises(ValueError, match="constant, linear, cosine"):
        Schedule(lr=1.0, min_lr=0.0, warmup_iters=0, decay_iters=1, style="exp")


def test_scheduler_sets_groups_and_restores_from_state():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=123.0)
    s = Schedule(lr=1.0, min_lr=0.0, warmup_iters=4, decay_iters=20, style="linear")
    sched = AnnealingLR(opt, s)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
    for _ in range(7):
        sched.step()
    other = AnnealingLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), s)
    other.load_state_dict(sched.state_dict())
    assert other.get_lr() == sched.get_lr() == [pytest.approx(learning_rate(7, s))]
