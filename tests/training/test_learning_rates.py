"""The LR schedule equals GPT-NeoX's AnnealingLR (megatron/learning_rates.py there) at every
iteration, for every decay style, with warmup and decay lengths derived as GPT-NeoX derives
them; the scheduler's state follows GPT-NeoX's keys and its resume rules."""

import math

import pytest
import torch

from megatron.neox_arguments import NeoXArgs
from megatron.training.learning_rates import AnnealingLR, Schedule, learning_rate, lr_schedule
from tests.runs import ROOT


class NeoXAnnealingLR:
    """GPT-NeoX's scheduler as its source computes it: built with last_iter 0 (which sets the
    first lr), stepped once per optimizer step."""

    def __init__(self, start_lr, warmup_iter, total_iters, decay_style, min_lr):
        self.start_lr, self.warmup_iter, self.end_iter = start_lr, warmup_iter, total_iters
        self.decay_style, self.min_lr, self.num_iters = decay_style, min_lr, 0

    def get_lr(self):
        n = self.num_iters
        if self.warmup_iter > 0 and n <= self.warmup_iter:
            return float(self.start_lr) * max(1, n) / self.warmup_iter
        n = n - self.warmup_iter
        end = self.end_iter - self.warmup_iter
        if self.decay_style == "linear":
            lr = self.start_lr * (end - n) / end
        elif self.decay_style == "cosine":
            lr = self.min_lr + (self.start_lr - self.min_lr) / 2.0 * (math.cos(math.pi * n / end)
                                                                     + 1)
        elif self.decay_style == "exponential":
            lr = self.start_lr * math.exp(-0.693 * n / end)
        else:
            lr = self.start_lr
        return max(lr, self.min_lr)

    def step(self):
        self.num_iters += 1


def neox_decay_iters(train_iters, lr_decay_iters, lr_decay_fraction):
    """GPT-NeoX's get_learning_rate_scheduler: the decay length and warmup it passes on."""
    if lr_decay_iters is not None:
        num_iters = lr_decay_iters
    elif lr_decay_fraction is not None:
        num_iters = math.floor(train_iters * lr_decay_fraction)
    else:
        num_iters = train_iters
    return max(1, num_iters)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine", "exponential"])
@pytest.mark.parametrize("train_iters, decay_iters, fraction, warmup, min_lr", [
    (1000, None, None, 0.01, 0.0),       # GPT-NeoX's defaults
    (1000, 800, None, 0.1, 6e-5),        # decay ends before training does
    (1000, None, 0.9, 0.05, 1e-4),       # lr_decay_fraction
    (150, None, None, 0.01, 0.0),        # a warmup of 1.5 steps (not rounded)
    (200, None, None, 0.0, 1e-5),        # no warmup
])
def test_every_iteration_equals_gpt_neox(style, train_iters, decay_iters, fraction, warmup,
                                         min_lr):
    args = NeoXArgs.from_ymls([ROOT / "configs/tiny.yml"], {
        "train_iters": train_iters, "lr_decay_iters": decay_iters, "lr_decay_fraction": fraction,
        "warmup": warmup, "min_lr": min_lr, "lr_decay_style": style, "num_gpus": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 6e-4}}})
    total = neox_decay_iters(train_iters, decay_iters, fraction)
    theirs = NeoXAnnealingLR(6e-4, warmup * total, total, style, min_lr)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    ours = AnnealingLR(opt, lr_schedule(args))
    for _ in range(train_iters + 50):  # past the end of decay too
        assert opt.param_groups[0]["lr"] == theirs.get_lr()  # the lr of this optimizer step
        ours.step()
        theirs.step()


def test_warmup_starts_at_lr_over_w_twice_then_climbs():
    s = Schedule(lr=1.0, min_lr=0.0, warmup_iters=10, decay_iters=100, style="cosine")
    assert [learning_rate(n, s) for n in (0, 1, 2, 9, 10)] == pytest.approx(
        [0.1, 0.1, 0.2, 0.9, 1.0])


def test_linear_decays_to_zero_at_the_end_and_is_clipped_at_min_lr():
    s = Schedule(lr=1.0, min_lr=0.1, warmup_iters=0, decay_iters=100, style="linear")
    assert learning_rate(50, s) == pytest.approx(0.5)  # lr * (end - n) / end, not a ramp to min
    assert learning_rate(95, s) == pytest.approx(0.1) == learning_rate(10_000, s)


def test_a_warmup_that_fills_the_decay_holds_min_lr_after_it():
    s = Schedule(lr=1.0, min_lr=0.1, warmup_iters=100, decay_iters=100, style="linear")
    assert learning_rate(100, s) == 1.0 and learning_rate(101, s) == 0.1


def test_unknown_style_lists_the_valid_ones():
    with pytest.raises(ValueError, match="constant, linear, cosine, exponential"):
        Schedule(lr=1.0, min_lr=0.0, warmup_iters=0, decay_iters=1, style="exp")


def _stepped(schedule, steps, **flags):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=123.0)
    sched = AnnealingLR(opt, schedule, **flags)
    for _ in range(steps):
        sched.step()
    return sched


S = Schedule(lr=1.0, min_lr=0.0, warmup_iters=4, decay_iters=20, style="linear")


def test_state_uses_gpt_neox_keys_and_restores_the_step():
    saved = _stepped(S, 7)
    assert saved.state_dict() == {"start_lr": 1.0, "min_lr": 0.0, "warmup_iter": 4,
                                  "end_iter": 20, "decay_style": "linear", "num_iters": 7}
    other = _stepped(S, 0)
    other.load_state_dict(saved.state_dict())
    assert other.get_lr() == saved.get_lr() == [pytest.approx(learning_rate(7, S))]
    old_form = {"num_steps": 7, "schedule": dict(lr=1.0, min_lr=0.0, warmup_iters=4,
                                                 decay_iters=20, style="linear")}
    other.load_state_dict(old_form)
    assert other.num_steps == 7


def test_a_changed_schedule_on_resume_is_refused_unless_told_which_wins():
    saved = _stepped(S, 7).state_dict()
    longer = Schedule(lr=2.0, min_lr=0.0, warmup_iters=4, decay_iters=40, style="linear")
    with pytest.raises(ValueError, match=r"learning-rate schedule differs from the config's "
                       r"\(learning rate \(lr\): checkpoint 1.0, config 2.0; decay iterations "
                       r"\(lr_decay_iters / train_iters\): checkpoint 20, config 40\). Set "
                       r"override_lr_scheduler: true .* use_checkpoint_lr_scheduler: true"):
        _stepped(longer, 0).load_state_dict(saved)
    kept = _stepped(longer, 0, use_checkpoint=True)
    kept.load_state_dict(saved)
    assert kept.schedule == S and kept.get_lr() == [pytest.approx(learning_rate(7, S))]
    overridden = _stepped(longer, 0, override=True)
    overridden.load_state_dict(saved)
    assert overridden.schedule == longer
    assert overridden.get_lr() == [pytest.approx(learning_rate(7, longer))]
    with pytest.raises(ValueError, match="both set; choose one"):
        _stepped(S, 0, use_checkpoint=True, override=True)
