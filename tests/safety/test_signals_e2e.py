"""Preemption in real runs: SIGTERM, as SLURM or Kubernetes send it, reaches a worker of a
two-process run. What a user relies on: the run finishes the step, saves a checkpoint of that
iteration, says so in one line and exits with 143 (128 + SIGTERM); no worker is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil

from tests.runs import ROOT, tiny_overrides, wait_for_text, worker_processes


def start(small_data, run, **extra) -> tuple[subprocess.Popen, object]:
    log = open(run.parent / f"{run.name}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
         *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=1000,
                         eval_interval=1000, log_interval=1, **extra)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def test_sigterm_to_one_worker_saves_the_step_and_exits_143(small_data, tmp_path):
    run = tmp_path / "run"
    proc, log = start(small_data, run)
    pids = []
    try:
        wait_for_text(tmp_path / "run.log", "iteration      3/", proc)
        found = worker_processes(proc.pid)
        pids = [p.pid for p in found]
        assert len(found) == 2
        found[1].send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 143
    finally:
        proc.kill()
        log.close()
    out = (tmp_path / "run.log").read_text()
    assert "received SIGTERM: stopping after this step, with a checkpoint" in out
    latest = (run / "ckpt" / "latest").read_text()
    assert f"preempted (SIGTERM) at iteration {latest[len('global_step'):]}; checkpoint " \
           f"{run / 'ckpt'}/{latest}" in out
    assert int(latest[len("global_step"):]) >= 3
    assert not [p for p in pids if psutil.pid_exists(p) and
                psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
