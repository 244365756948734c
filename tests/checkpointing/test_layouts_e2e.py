"""Real runs at tensor x pipeline parallelism 2 x 2 (four gloo processes, `python deepy.py
train.py configs/tiny.yml`'s launch with its workers forked in-process, tests/runs.py): stopping and resuming is bitwise identical to an uninterrupted run
(bf16 with dropout, which draws from the restored tensor-parallel generators), and the
checkpoint resumes at tensor x pipeline 1 x 1 (two data-parallel processes), resharded on load,
continuing the same loss curve. Dropout is off there, since the resharded run's random
generators restart from the seed. `tools/ckpts/reshard.py` writes the same state at tensor x
pipeline 1 x 1 without training.
"""

from __future__ import annotations

import json

import pytest

from tests.checkpointing.test_resume_e2e import (assert_stop_and_resume_exact, copy_checkpoints,
                                                 losses_by_iteration, run)
from tests.checkpointing.test_reshard import assert_same_state, full_state
from tests.runs import deepy, explain, launch_in_process, tiny_overrides

TP2_PP2 = dict(num_gpus=4, model_parallel_size=2, pipe_parallel_size=2, hidden_dropout=0.0)
RESHARD_RTOL = 1e-4  # fp32; other tensor-parallel splits sum in another order


PRECISIONS = {"fp32": {}, "bf16": {"bf16": "{enabled: true}", "hidden_dropout": 0.1}}
_references: dict = {}


@pytest.fixture
def reference(small_data, tmp_path_factory):
    """The uninterrupted tp2 x pp2 run of a precision: (losses by iteration, checkpoint root)."""
    def get(precision: str = "fp32"):
        if precision not in _references:
            run_dir = tmp_path_factory.mktemp(f"reference-tp2pp2-{precision}")
            proc = run(small_data, run_dir, **{**TP2_PP2, **PRECISIONS[precision]})
            assert proc.returncode == 0, explain(proc)
            _references[precision] = (losses_by_iteration(run_dir), run_dir / "ckpt")
        return _references[precision]
    return get


@pytest.mark.slow
def test_tp2_pp2_stop_and_resume_is_bitwise_identical(small_data, tmp_path, reference):
    """bf16 with dropout: the bf16 optimizer's partitions and the tensor-parallel generators
    (fp32 stop and resume: tests/checkpointing/test_resume_e2e.py)."""
    assert_stop_and_resume_exact(small_data, tmp_path, reference("bf16"),
                                 **{**TP2_PP2, **PRECISIONS["bf16"]})


def test_a_tp2_pp2_checkpoint_resumes_at_tp1_pp1(small_data, tmp_path, reference):
    want_losses, want_root = reference("fp32")
    copy_checkpoints(want_root, tmp_path)
    proc = run(small_data, tmp_path, iteration=4, num_gpus=2, model_parallel_size=1,
               pipe_parallel_size=1, hidden_dropout=0.0)
    assert proc.returncode == 0, explain(proc)
    text = proc.stdout + proc.stderr
    assert "resharded" in text and "model_parallel_size (tp): checkpoint 2, this run 1" in text
    assert "weights, optimizer state loaded" in text
    got = losses_by_iteration(tmp_path)
    assert sorted(got) == [5, 6]
    assert [got[i] for i in (5, 6)] == pytest.approx([want_losses[i] for i in (5, 6)],
                                                     rel=RESHARD_RTOL)


def test_the_reshard_tool_rewrites_a_tp2_pp2_checkpoint_at_tp1(small_data, tmp_path, reference):
    """The whole state, the learning-rate schedule included, though the config's train_iters
    (20) and so its schedule differ from the run that wrote the checkpoint (6)."""
    _, want_root = reference("fp32")
    prefix, tok = small_data
    out = tmp_path / "tp1"
    proc = launch_in_process("tools/ckpts/reshard.py", "configs/tiny.yml",
                             *tiny_overrides(prefix, tok, tmp_path, num_gpus=2,
                                             model_parallel_size=1, pipe_parallel_size=0,
                                             load=want_root, save=out))
    assert proc.returncode == 0, explain(proc)
    manifest = json.loads((out / "global_step6" / "manifest.json").read_text())
    assert {k: manifest["run"][k] for k in ("tp", "pipe_parallel_size", "dp")} == {
        "tp": 1, "pipe_parallel_size": 0, "dp": 2}
    assert manifest["client_state"]["consumed_train_samples"] == 6 * 16
    assert_same_state(full_state(want_root), full_state(out))


@pytest.mark.parametrize("overrides,message", [
    ({}, "'save' and 'load' are both {tmp}/ckpt: write the resharded checkpoint to another "
         "directory"),
    ({"load": "null"}, "resharding reads the checkpoint in 'load' and writes it to 'save': set both"),
    ({"load": "{tmp}/empty", "save": "{tmp}/out"},
     "no checkpoint to load in {tmp}/empty: it has no 'latest' file (checkpoints found: none)"),
], ids=["onto-its-input", "without-load", "nothing-to-reshard"])
def test_the_reshard_tool_refuses_before_any_worker_starts(small_data, tmp_path, overrides,
                                                           message):
    prefix, tok = small_data
    (tmp_path / "empty").mkdir()
    values = {k: v.format(tmp=tmp_path) for k, v in overrides.items()}
    proc = deepy("tools/ckpts/reshard.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, tmp_path, num_gpus=2, **values))
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, explain(proc)
    assert errors[0].startswith(f"error: {message.format(tmp=tmp_path)}"), errors[0]
    assert "worker(s)" not in proc.stderr
