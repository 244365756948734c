"""The loss and gradient guard's decisions, step by step (megatron/safety/guard.py)."""

from __future__ import annotations

import math

import pytest

from megatron.safety.guard import StepGuard


def run(guard: StepGuard, steps) -> list[str]:
    return [guard.after_step(i, loss, skipped).action
            for i, (loss, skipped) in enumerate(steps, start=1)]


def test_skip_reports_bad_steps_and_stops_after_max_bad_steps_in_a_row():
    guard = StepGuard("skip", max_bad_steps=3)
    actions = run(guard, [(2.0, False), (math.nan, True), (2.0, False), (math.inf, False),
                          (9.0, True), (math.nan, True)])
    assert actions == ["ok", "warn", "ok", "warn", "warn", "stop"]
    verdict = guard.after_step(7, math.nan, True)
    assert verdict.action == "stop"
    assert "4 bad steps in a row since iteration 4 (max_bad_steps 3)" in verdict.message
    assert not guard.healthy


def test_a_good_step_after_bad_ones_makes_the_run_healthy_again():
    guard = StepGuard("skip")
    run(guard, [(math.nan, True)])
    assert not guard.healthy and guard.problem == "iteration 1: the loss is nan"
    run(guard, [(2.0, False)])
    assert guard.healthy


def test_stop_stops_at_the_first_bad_step_naming_iteration_and_value():
    verdict = StepGuard("stop").after_step(12, math.inf, True)
    assert verdict.action == "stop"
    assert verdict.message == "iteration 12: the loss is inf; bad_step_policy is stop"


def test_rollback_until_max_rollbacks_then_stop():
    guard = StepGuard("rollback", max_rollbacks=2)
    assert run(guard, [(1.0, False), (math.nan, True), (math.nan, True), (math.nan, True)]) \
        == ["ok", "rollback", "rollback", "stop"]
    assert "2 rollbacks (max_rollbacks) did not get past it" in guard.after_step(
        5, math.nan, True).message


def test_finite_loss_with_skipped_update_is_bad():
    verdict = StepGuard("stop").after_step(3, 2.5, True)
    assert verdict.message == "iteration 3: the gradients hold inf or NaN; bad_step_policy is stop"


@pytest.mark.parametrize("policy, action", [("skip", "warn"), ("stop", "stop"),
                                            ("rollback", "rollback")])
def test_a_spike_over_the_window_mean_is_bad_once_the_window_is_full(policy, action):
    guard = StepGuard(policy, spike_factor=3.0, spike_window=4)
    assert run(guard, [(2.0, False), (2.0, False), (9.0, False)]) == ["ok", "ok", "ok"]  # not full
    guard = StepGuard(policy, spike_factor=3.0, spike_window=4)
    assert run(guard, [(2.0, False)] * 4) == ["ok"] * 4
    verdict = guard.after_step(5, 6.5, False)
    assert verdict.action == action
    assert "the loss 6.5000 is 3.2x the mean 2.0000 of the last 4 steps" in verdict.message


def test_skip_keeps_a_spike_in_the_mean_because_its_update_was_applied():
    guard = StepGuard("skip", spike_factor=2.0, spike_window=2)
    run(guard, [(1.0, False), (1.0, False)])
    assert "update was applied" in guard.after_step(3, 5.0, False).message
    assert guard.healthy and list(guard.recent) == [1.0, 5.0]


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="valid: skip, stop, rollback"):
        StepGuard("retry")


@pytest.mark.parametrize("policy", ["skip", "stop", "rollback"])
def test_fp16_overflows_are_neither_good_nor_bad_steps(policy):
    """A step skipped by fp16's dynamic loss scaling is the scaler finding its scale: any
    number of them in a row, under any policy, goes on; a non-finite loss is still bad."""
    guard = StepGuard(policy, max_bad_steps=2)
    assert [guard.after_step(i, 7.5, True, overflow=True).action for i in range(1, 20)] \
        == ["ok"] * 19
    assert guard.healthy
    assert guard.after_step(20, math.nan, True, overflow=True).action == {
        "skip": "warn", "stop": "stop", "rollback": "rollback"}[policy]
    if policy == "skip":  # an overflow after a bad step does not make the run sound again
        assert guard.after_step(21, 7.5, True, overflow=True).action == "ok"
        assert not guard.healthy
