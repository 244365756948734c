"""A hang in a real run (`python deepy.py train.py configs/tiny.yml`, two processes): one worker
is stopped with SIGSTOP mid-training. What a user relies on: the job ends by itself with code
124 instead of waiting forever, the healthy rank prints its stack and names the stopped rank
and the phase, and no worker is left behind. Then a rank whose data loader stalls: the other
rank's collective times out and names where it was."""

from __future__ import annotations

import contextlib
import json
import os
import re
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


def endless_run(small_data, run_dir, **overrides) -> subprocess.Popen:
    """`deepy.py train.py configs/tiny.yml` on two processes, training until stopped, in its own
    session (so that a failed test can kill all of it)."""
    argv = tiny_overrides(*small_data, run_dir, train_iters=10000, eval_interval=10000,
                          checkpoint_factor=10000, log_interval=1, **overrides)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "deepy.py"), "train.py",
                             "configs/tiny.yml", *argv], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_a_stopped_worker_ends_the_job_with_both_ranks_named(small_data, tmp_path):
    deepy = endless_run(small_data, tmp_path, hang_timeout_minutes=STEP_LIMIT_MINUTES,
                        hang_step_factor=0)
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
    # rank 0 waits in the step's collectives, or, when rank 1 stopped after sending its part
    # of the step's last one, in the all-reduce after the step that agrees on a stop signal
    phase = re.search(r", phase (train step|stop check) has run .*\(limit 6\.0 s\), in "
                      r"torch\.distributed\.", out)
    assert phase, out[-6000:]
    assert "hang watchdog: the stack of every thread of rank 0:" in out
    code = {"train step": "megatron/training/step.py", "stop check": "megatron/safety/signals.py"}
    assert code[phase.group(1)] + '", line' in out  # the stack reaches where it waits
    assert (f"rank 1 (host {host}, pid {pids[1]}) is not progressing: its heartbeat stopped at "
            "iteration ") in out, out[-6000:]
    assert not left, f"workers {left} outlived the job"


@pytest.mark.slow
def test_a_stalled_data_loader_ends_the_job_at_the_collective_timeout_and_is_named(small_data,
                                                                                   tmp_path):
    """Rank 1's data-loader workers are stopped (SIGSTOP) mid-training: rank 1 waits for a
    batch outside any collective, its heartbeat still written (every 2 s with a 1-minute step
    limit). Rank 0's next collective times out (distributed_timeout_minutes 0.1: 6 s, before the
    hang watchdog's limit) and says where rank 1 was: in the DataLoader, at its iteration. The
    job ends with status 1."""
    deepy = endless_run(small_data, tmp_path, num_workers=2, distributed_timeout_minutes=0.1,
                        hang_timeout_minutes=1)
    stopped = []
    try:
        beat = wait_for_beat(tmp_path / "logs" / "heartbeats", 1, deepy, 3, ENDS_WITHIN)
        stopped = [p for p in psutil.Process(beat["pid"]).children()
                   if p.name() == "pt_data_worker"]  # torch names its loader workers so
        assert len(stopped) >= 2, stopped  # the train loader's two, and the validation one's
        for proc in stopped:
            proc.send_signal(signal.SIGSTOP)
        out, _ = deepy.communicate(timeout=ENDS_WITHIN)
    finally:
        for proc in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        if deepy.poll() is None:
            os.killpg(deepy.pid, signal.SIGKILL)
            deepy.wait()
    assert deepy.returncode == 1, out[-6000:]
    host = beat["host"]
    assert re.search(rf"collective timeout: rank 0 \(host {host}, pid \d+\) waited 6 s "
                     r"\(distributed_timeout_minutes\) at iteration \d+, phase train step, in "
                     r"torch\.distributed\.", out), out[-6000:]
    assert re.search(r"collective timeout: rank 1: iteration \d+, train step for \d+\.\d s, in "
                     r"torch's DataLoader \(waiting for a batch\), called at megatron/training/"
                     r"data\.py:\d+ \(<genexpr>\); written \d+\.\d s ago", out), out[-6000:]
    assert (f"error (rank 0 on {host}): a collective timed out: this rank waited 6 s "
            "(distributed_timeout_minutes) for another rank that never joined it") in out
    assert "Timed out waiting" not in out  # gloo's own message is not repeated
