"""A hang in a real run (`python deepy.py train.py configs/tiny.yml`, two processes): one worker
is stopped with SIGSTOP mid-training. What a user relies on: the job ends by itself with code
124 instead of waiting forever, the healthy rank prints its stack and names the stopped rank
and the phase, and no worker is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest

from megatron.safety.watchdog import EXIT_CODE
from tests.runs import ROOT, tiny_overrides
from tests.safety.test_watchdog import wait_for_beat

STEP_LIMIT_MINUTES = 0.1  # 6 s; the tiny model's steps take well under a second
ENDS_WITHIN = 240  # start-up, the limit, the report and the launcher's 30 s grace to stop


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_a_stopped_worker_ends_the_job_with_both_ranks_named(small_data, tmp_path):
    overrides = tiny_overrides(*small_data, tmp_path, train_iters=10000, eval_interval=10000,
                               checkpoint_factor=10000, log_interval=1,
                               hang_timeout_minutes=STEP_LIMIT_MINUTES, hang_step_factor=0)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    deepy = subprocess.Popen([sys.executable, str(ROOT / "deepy.py"), "train.py",
                              "configs/tiny.yml", *overrides], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    pids = []
    try:
        pids = [wait_for_beat(tmp_path / "logs" / "heartbeats", rank, deepy, 3, ENDS_WITHIN)["pid"]
                for rank in (0, 1)]
        os.kill(pids[1], signal.SIGSTOP)
        out, _ = deepy.communicate(timeout=ENDS_WITHIN)
        left = [pid for pid in pids if not gone(pid)]
    finally:  # a failed test leaves nothing behind either
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if deepy.poll() is None:
            os.killpg(deepy.pid, signal.SIGKILL)
            deepy.wait()
    assert deepy.returncode == EXIT_CODE, out[-6000:]
    host = json.loads((tmp_path / "logs" / "heartbeats" / "rank00000.json").read_text())["host"]
    assert f"hang watchdog: rank 0 (host {host}, pid {pids[0]}): iteration " in out, out[-6000:]
    assert ", phase train step has run " in out and "(limit 6.0 s), in torch.distributed." in out
    assert "hang watchdog: the stack of every thread of rank 0:" in out
    assert "megatron/training/step.py\", line" in out  # the stack reaches the training step
    assert (f"rank 1 (host {host}, pid {pids[1]}) is not progressing: its heartbeat stopped at "
            "iteration ") in out, out[-6000:]
    assert not left, f"workers {left} outlived the job"
