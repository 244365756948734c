"""What deepy.py leaves behind, whatever happens to it: workers end when deepy.py is killed
(the parent-death signal), a process a worker left running is swept by its launch ID, and a
second SIGINT cuts signal_grace_seconds to a few seconds. Real deepy.py launches of small
worker scripts (docs/launching.md, "When a worker dies, and stopping a run")."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from megatron.launching.stopping import LAST_CHANCE_SECONDS
from tests.runs import ROOT, clean_env

PREAMBLE = """\
import os, pathlib, signal, subprocess, sys, time
out = pathlib.Path(sys.argv[0]).parent
def note(name, pid):  # written whole (rename), so the test never reads half a number
    part = out / f".{name}"
    part.write_text(str(pid))
    part.rename(out / name)
"""


def launch(tmp_path: Path, body: str, *overrides: str) -> tuple[subprocess.Popen, Path]:
    """deepy.py starting two workers that run PREAMBLE + `body`; its output's file."""
    script = tmp_path / "worker.py"
    script.write_text(PREAMBLE + body)
    log = tmp_path / "deepy.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), str(script), "configs/tiny.yml",
             *overrides], cwd=ROOT, env=clean_env(), stdout=out, stderr=subprocess.STDOUT)
    return proc, log


def wait_for_pids(proc: subprocess.Popen, log: Path, *names: Path, timeout=120) -> list[int]:
    deadline = time.monotonic() + timeout
    while not all(n.exists() for n in names):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)
    return [int(n.read_text()) for n in names]


def alive(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.NoSuchProcess:
            pass
    return found


def gone_within(pids: list[int], seconds: float) -> list[int]:
    """The processes of `pids` still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_workers_end_when_deepy_itself_is_killed(tmp_path):
    """SIGKILL to deepy.py (the OOM killer, `kill -9`): it can pass nothing on, and its workers
    get SIGTERM from the kernel, so none is left holding memory, the port or the run's lock."""
    proc, log = launch(tmp_path, "note(os.environ['RANK'], os.getpid())\ntime.sleep(600)\n")
    try:
        pids = wait_for_pids(proc, log, tmp_path / "0", tmp_path / "1")
        assert alive(pids) == pids
        proc.kill()
        proc.wait(timeout=30)
        assert gone_within(pids, 30) == [], log.read_text()
    finally:
        proc.kill()
        for pid in alive([int(p.read_text()) for p in tmp_path.glob("[01]")]):
            psutil.Process(pid).kill()


def test_a_process_a_worker_left_running_is_swept_when_deepy_ends(tmp_path):
    """A worker that exits 0 leaving a process of its own in another session (a data-loader
    worker or a compiler daemon that outlived it): deepy.py ends the run and kills it, found by
    the launch ID in its environment. It held the worker's output pipe, which deepy.py stops
    reading after a few seconds."""
    body = ("child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            "start_new_session=True)\nnote('child' + os.environ['RANK'], child.pid)\n")
    proc, log = launch(tmp_path, body)
    try:
        assert proc.wait(timeout=120) == 0, log.read_text()
        children = [int((tmp_path / f"child{r}").read_text()) for r in (0, 1)]
        assert alive(children) == [], log.read_text()
    finally:
        proc.kill()
        for pid in alive([int(p.read_text()) for p in tmp_path.glob("child*")]):
            psutil.Process(pid).kill()


def test_a_second_sigint_stops_the_run_within_seconds_not_the_grace_time(tmp_path):
    """Workers that take no notice of signals (a save that does not finish): the first SIGINT
    gives them signal_grace_seconds (600 here), a second leaves LAST_CHANCE_SECONDS, after
    which deepy.py kills them and exits 130."""
    body = ("signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "note(os.environ['RANK'], os.getpid())\ntime.sleep(600)\n")
    proc, log = launch(tmp_path, body, "signal_grace_seconds=600")
    try:
        pids = wait_for_pids(proc, log, tmp_path / "0", tmp_path / "1")
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        assert proc.poll() is None and alive(pids) == pids  # the grace time runs
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(timeout=LAST_CHANCE_SECONDS + 60) == 130, log.read_text()
        # at most the last chance plus the kill (measured from the second signal)
        assert time.monotonic() - started < LAST_CHANCE_SECONDS + 30
        assert alive(pids) == []
        out = log.read_text()
        # not train.py: nothing is saved, and the line promises nothing
        assert "deepy.py: received SIGINT: passing it to the workers, which stop at once; " \
               "waiting up to signal_grace_seconds=600 s" in out, out
        assert out.count("received SIGINT") == 1, out  # the second is not announced again
    finally:
        proc.kill()
        for pid in alive([int(p.read_text()) for p in tmp_path.glob("[01]")]):
            psutil.Process(pid).kill()
