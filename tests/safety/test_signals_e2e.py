"""Preemption in real runs: SIGTERM, as SLURM or Kubernetes send it, reaches a worker of a
two-process run. What a user relies on: the run finishes the step, saves a checkpoint of that
iteration, says so in one line and exits with 143 (128 + SIGTERM); no worker is left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from tests.runs import ROOT, tiny_overrides


def workers(deepy: subprocess.Popen) -> list[psutil.Process]:
    """The training workers `deepy` started (not their data-loader processes)."""
    found = []
    for child in psutil.Process(deepy.pid).children():
        try:
            if "train.py" in child.cmdline():
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def start(small_data, run, **extra) -> tuple[subprocess.Popen, object]:
    log = open(run.parent / f"{run.name}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
         *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=1000,
                         eval_interval=1000, log_interval=1, **extra)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
    return proc, log


def wait_for(path, text: str, proc, limit: float = 300) -> None:
    deadline = time.time() + limit
    while text not in path.read_text():
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.time() < deadline, path.read_text()[-3000:]
        time.sleep(0.5)


def test_sigterm_to_one_worker_saves_the_step_and_exits_143(small_data, tmp_path):
    run = tmp_path / "run"
    proc, log = start(small_data, run)
    pids = []
    try:
        wait_for(tmp_path / "run.log", "iteration      3/", proc)
        found = workers(proc)
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
