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


def test_sigusr1_to_every_process_of_the_job_saves_the_step(small_data, tmp_path):
    """As `sbatch --signal=USR1@120` or `scancel --signal=USR1 --full` deliver it: to each
    worker and each of its data-loader processes (num_workers 2), not through deepy.py. The
    loaders ignore it; the workers finish the step, save it and stop."""
    run = tmp_path / "run"
    proc, log = start(small_data, run, num_workers=2)
    try:
        wait_for_text(tmp_path / "run.log", "iteration      3/", proc)
        workers = worker_processes(proc.pid)
        loaders = [c for w in workers for c in w.children(recursive=True)]
        assert len(workers) == 2 and len(loaders) >= 4, (workers, loaders)
        for p in loaders + workers:
            p.send_signal(signal.SIGUSR1)
        status = proc.wait(timeout=300)
    finally:
        proc.kill()
        log.close()
    out = (tmp_path / "run.log").read_text()
    latest = (run / "ckpt" / "latest").read_text()
    iteration = int(latest[len("global_step"):])
    assert iteration >= 3
    assert f"preempted (SIGUSR1) at iteration {iteration}; checkpoint {run / 'ckpt'}/{latest}" \
        in out, out[-3000:]
    assert status == 128 + signal.SIGUSR1, (status, out[-3000:])
    assert "DataLoader worker" not in out, out[-3000:]


def test_save_on_signal_false_stops_without_a_checkpoint(small_data, tmp_path):
    run = tmp_path / "run"
    proc, log = start(small_data, run, save_on_signal="false")
    try:
        wait_for_text(tmp_path / "run.log", "iteration      3/", proc)
        worker_processes(proc.pid)[0].send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 143
    finally:
        proc.kill()
        log.close()
    out = (tmp_path / "run.log").read_text()
    assert not (run / "ckpt").exists() or not list((run / "ckpt").glob("global_step*")), out
    assert "preempted (SIGTERM) at iteration " in out and "; no checkpoint saved" in out, \
        out[-3000:]
    assert "received SIGTERM: stopping after this step, without a checkpoint (save_on_signal " \
           "is false)" in out, out[-3000:]
