"""`deepy.py` watching the job it started: signals passed on, a grace time, nothing left behind.

    status = supervise(argv, env, grace_seconds=120, script="train.py")

The launcher command runs in its own session, so a Ctrl-C in the terminal reaches `deepy.py`
alone. SIGTERM (what Kubernetes sends) or SIGINT to `deepy.py` is passed to the training
workers on this machine (for a multi-node launch, to the launcher, which passes it on); each
worker finishes its step, saves and exits (megatron.safety.signals). If the job has not ended
`grace_seconds` after the first signal, or at a second signal plus a few seconds, every
process of the session is killed. When the job ends, any process of the session still alive
(a data-loader worker, a launcher left behind) is killed: no orphan survives `deepy.py`.
The status is the job's, or 128 + the signal when the job had to be killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import psutil

HANDLED = (signal.SIGTERM, signal.SIGINT)
LAST_CHANCE_SECONDS = 10.0  # after a second signal


def local_workers(launcher: psutil.Process, script: str) -> list[psutil.Process]:
    """The workers DeepSpeed's launcher started on this machine for `script` (not their own
    child processes)."""
    found = []
    for child in launcher.children(recursive=True):
        try:
            parent = " ".join(child.parent().cmdline())
            if any(part.endswith(script) for part in child.cmdline()) and \
                    "deepspeed.launcher.launch" in parent:
                found.append(child)
        except psutil.Error:
            continue
    return found


class Supervisor:
    """Runs one launcher command and passes signals on (see the module docstring)."""

    def __init__(self, argv: list[str], env: dict, grace_seconds: float, script: str):
        self.argv, self.env, self.script = argv, env, os.path.basename(script)
        self.grace = grace_seconds
        self.signals: list[int] = []
        self.deadline: float | None = None
        self.proc: subprocess.Popen | None = None

    def _forward(self, signum: int, frame) -> None:
        self.signals.append(signum)
        name = signal.Signals(signum).name
        launcher = psutil.Process(self.proc.pid)
        targets = local_workers(launcher, self.script) or [launcher]
        for target in targets:
            try:
                target.send_signal(signum)
            except psutil.Error:
                pass
        if len(self.signals) == 1:
            self.deadline = time.monotonic() + self.grace
            print(f"deepy.py: {name}: the workers stop after their current step and save "
                  f"(waiting up to {self.grace:g} s; send it again to stop at once)", flush=True)
        else:
            self.deadline = min(self.deadline, time.monotonic() + LAST_CHANCE_SECONDS)

    def run(self) -> int:
        previous = {s: signal.getsignal(s) for s in HANDLED}
        self.proc = subprocess.Popen(self.argv, env=self.env, start_new_session=True)
        try:
            for s in HANDLED:
                signal.signal(s, self._forward)
            return self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            kill_session(self.proc.pid)

    def _wait(self) -> int:
        while True:
            try:
                return self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            if self.deadline is not None and time.monotonic() > self.deadline:
                print(f"deepy.py: the workers did not stop within the grace time: killing them",
                      flush=True)
                kill_session(self.proc.pid)
                self.proc.wait()
                return 128 + self.signals[0]


def kill_session(session_leader: int) -> None:
    """SIGKILL every process still in the session `session_leader` started."""
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getsid(proc.pid) == session_leader and proc.pid != os.getpid():
                proc.kill()
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue


def supervise(argv: list[str], env: dict, grace_seconds: float, script: str) -> int:
    return Supervisor(argv, env, grace_seconds, script).run()
