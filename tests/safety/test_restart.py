"""The restart policy of `max_restarts` without launching: which exit statuses restart, what
each restart says, and which config starts the next attempt."""

from __future__ import annotations

import logging

import pytest

from megatron.checkpointing.manifest import MANIFEST_NAME, Manifest
from megatron.neox_arguments import NeoXArgs
from megatron.neox_arguments.errors import ConfigError
from megatron.restart import describe_status, restart_point, run_with_restarts


def config(tmp_path, **values):
    values = {"save": str(tmp_path / "ckpt"), "max_restarts": 2, **values}
    return NeoXArgs.from_ymls(["configs/tiny.yml"], [f"{k}={v}" for k, v in values.items()])


def attempts(statuses):
    seen = []

    def attempt(args):
        seen.append(args)
        return statuses[len(seen) - 1]
    return attempt, seen


@pytest.mark.parametrize("statuses,runs,final", [
    ([0], 1, 0),
    ([247, 0], 2, 0),            # a worker killed by SIGKILL, then a clean run
    ([1, 124, 1], 3, 1),         # a crash, a hang, a crash: both restarts used
    ([143], 1, 143),             # SIGTERM: a requested stop
    ([130], 1, 130),             # Ctrl-C
    ([3], 1, 3),                 # the loss guard stopped the run
    ([1, 3], 2, 3),
])
def test_which_failures_restart(tmp_path, statuses, runs, final):
    attempt, seen = attempts(statuses)
    assert run_with_restarts(config(tmp_path), "train.py", attempt) == final
    assert len(seen) == runs


def test_each_restart_and_the_last_failure_are_announced(tmp_path, caplog):
    attempt, _ = attempts([-9, 124, 1])
    with caplog.at_level(logging.INFO):
        run_with_restarts(config(tmp_path), "train.py", attempt)
    text = caplog.text
    assert "restart 1 of 2: the workers failed (killed by SIGKILL); no checkpoint in " in text
    assert "restart 2 of 2: the workers failed (exit status 124 (a hang, ended by the watchdog))" \
        in text
    assert "the workers failed (exit status 1) and all 2 restart(s) (max_restarts) are used" in text


def test_other_scripts_run_once(tmp_path, caplog):
    attempt, seen = attempts([1, 0])
    with caplog.at_level(logging.INFO):
        assert run_with_restarts(config(tmp_path), "generate.py", attempt) == 1
    assert len(seen) == 1
    assert "max_restarts applies to training runs; generate.py runs once" in caplog.text


def saved(ckpt, iteration, loss):
    """A checkpoint directory holding only its manifest (what the restart reads of it)."""
    step = ckpt / f"global_step{iteration}"
    step.mkdir(parents=True)
    manifest = Manifest(iteration=iteration, tag=step.name, run={}, contents={},
                        client_state={"last_loss": loss}, config={}, files={})
    (step / MANIFEST_NAME).write_text(manifest.to_json())


def test_the_next_attempt_loads_the_newest_finite_checkpoint_of_save(tmp_path):
    args = config(tmp_path, load=str(tmp_path / "pretrained"), finetune="true", iteration=3)
    same, where = restart_point(args)
    assert same is args and where.startswith(f"no checkpoint in {tmp_path / 'ckpt'} yet")
    saved(tmp_path / "ckpt", 4, 2.5)
    saved(tmp_path / "ckpt", 8, float("nan"))
    resumed, where = restart_point(args)
    assert (resumed.load, resumed.finetune, resumed.iteration) == (str(tmp_path / "ckpt"), False,
                                                                   None)
    assert where == (f"resuming from the newest valid checkpoint in {tmp_path / 'ckpt'} "
                     "(iteration 4)")


def test_describe_status():
    assert describe_status(-11) == "killed by SIGSEGV"
    assert describe_status(143) == "exit status 143 (128 + SIGTERM)"
    assert describe_status(247) == "exit status 247 (a worker killed by SIGKILL)"
    assert describe_status(2) == "exit status 2"


@pytest.mark.parametrize("values,message", [
    ({"save": None}, "max_restarts(2) restarts from the checkpoints in `save`, which is not set"),
    ({"max_restarts": -1}, "max_restarts(-1) must be at least 0"),
])
def test_config_refusals(tmp_path, values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config(tmp_path, **{k: ("null" if v is None else v) for k, v in values.items()})
