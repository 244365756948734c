"""Automatic restart in real runs: a worker of a two-process `configs/tiny.yml` run is killed
with SIGKILL after its first checkpoint. What a user relies on: with `max_restarts` the job
says why and from where it restarts, resumes from the newest valid checkpoint and finishes with
exit status 0, and every loss after the restart point equals an uninterrupted run's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from tests.runs import ROOT, deepy, explain, tiny_overrides, wait_for_text, worker_processes

RUN = dict(num_gpus=2, train_iters=14, checkpoint_factor=6, eval_interval=1000, log_interval=1)


def losses(run) -> dict[int, float]:
    """iteration -> lm_loss, the last record of each iteration (a restart repeats some)."""
    out = {}
    for line in (run / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "lm_loss" in record:
            out[record["iteration"]] = record["lm_loss"]
    return out


@pytest.mark.slow
def test_a_killed_worker_is_restarted_from_the_checkpoint_and_the_losses_match(small_data,
                                                                               tmp_path):
    reference = tmp_path / "reference"
    proc = deepy("train.py", "configs/tiny.yml", *tiny_overrides(*small_data, reference, **RUN))
    assert proc.returncode == 0, explain(proc)

    run = tmp_path / "run"
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
             *tiny_overrides(*small_data, run, max_restarts=2, **RUN)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_text(log_path, "iteration      7/14 ", proc)
            killed = worker_processes(proc.pid)
            assert len(killed) == 2, [p.cmdline() for p in killed]
            killed[1].send_signal(signal.SIGKILL)
            assert proc.wait(timeout=600) == 0, log_path.read_text()[-6000:]
        finally:
            proc.kill()
    out = log_path.read_text()
    assert out.count("restart 1 of 2: the workers failed (") == 1, out[-6000:]
    assert (f"resuming from the newest valid checkpoint in {run / 'ckpt'} (iteration 6)"
            in out), out[-6000:]
    assert "restart 2 of 2" not in out
    assert (run / "ckpt" / "latest").read_text() == "global_step14"
    expected, got = losses(reference), losses(run)
    assert sorted(got) == sorted(expected) == list(range(1, 15))
    # after the restart point the run is the uninterrupted one, bit for bit
    assert {i: got[i] for i in range(7, 15)} == {i: expected[i] for i in range(7, 15)}


def test_a_guard_stop_is_not_restarted(small_data, tmp_path):
    """A run stopped by the loss guard (NaN loss from the first step at lr 1e6, policy stop)
    exits 3 and is not started again."""
    run = tmp_path / "run"
    proc = deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(*small_data, run, num_gpus=1, train_iters=6, checkpoint_factor=3,
                                 eval_interval=1000, log_interval=1, max_restarts=3,
                                 bad_step_policy="stop", **{"optimizer.params.lr": 1e6}))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, explain(proc)
    assert "training stopped: iteration" in out, explain(proc)
    assert "not restarting: the run was stopped by the loss guard" in out, explain(proc)
    assert "restart 1 of 3" not in out
