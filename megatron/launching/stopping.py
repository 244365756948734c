"""deepy.py's side of stopping a run: its SIGTERM/SIGINT passed on, a grace time, no leftovers.

    with DeepySignals(grace_seconds=600, forward=send_to_workers) as signals:
        ...wait for the workers...
        if signals.expired(): kill what is left
    kill_tagged(launch_id)          # every process of the launch still alive on this machine

Workers are started in their own session, so a Ctrl-C in the terminal reaches deepy.py alone and
each worker gets each signal once, from deepy.py (a worker treats a second SIGINT as "stop at
once"). The first signal starts the grace time (`signal_grace_seconds`); a second one is passed
on too and leaves at most LAST_CHANCE_SECONDS. Every process of a launch carries NEOX_LAUNCH_ID
in its environment (children inherit it), so what is left on this machine when deepy.py is done
is found and killed by that tag, not by name.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import psutil

HANDLED = (signal.SIGTERM, signal.SIGINT)
LAUNCH_ID_VAR = "NEOX_LAUNCH_ID"
LAST_CHANCE_SECONDS = 10.0  # after a second signal


def new_launch_id() -> str:
    return uuid.uuid4().hex[:16]


def workers_on_stop(args, script: str) -> str:
    """What `script`'s workers do on deepy.py's first SIGTERM / SIGINT, as deepy.py announces
    it: train.py finishes its step (and saves when it can), generate.py its batch (and writes
    the samples done); the others just end (eval.py keeping its finished rounds of scores with
    eval_cache_dir)."""
    name = Path(script).name
    if name == "generate.py" and args.derived.text_gen_type != "interactive":
        return "which stop after the current batch and write the samples done so far"
    if name == "eval.py" and args.eval.eval_cache_dir:
        return ("which stop at once; what they scored stays in eval_cache_dir, and the same "
                "command run again scores only the rest")
    if name != "train.py":
        return "which stop at once"
    ck = args.checkpoint
    if not ck.save:
        return "which stop after the current step (no checkpoint: 'save' is not set)"
    if not ck.save_on_signal:
        return "which stop after the current step without saving (save_on_signal is false)"
    return "which stop after the current step and save"


class DeepySignals:
    """Notes deepy.py's SIGTERM / SIGINT while installed and hands each to `forward`."""

    def __init__(self, grace_seconds: float, forward: Callable[[int], None],
                 announce: bool = True, on_stop: str = "which stop"):
        self.grace, self.forward, self.announce = grace_seconds, forward, announce
        self.on_stop = on_stop  # what the workers do, from workers_on_stop
        self.signum = 0
        self.deadline: float | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "DeepySignals":
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self._received)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _received(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if not self.signum:
            self.signum = signum
            self.deadline = time.monotonic() + self.grace
            if self.announce:  # a pdsh node launcher's signal is deepy.py's, said there
                print(f"deepy.py: received {name}: passing it to the workers, {self.on_stop}; "
                      f"waiting up to signal_grace_seconds="
                      f"{self.grace:g} s (send it again to stop sooner)", file=sys.stderr,
                      flush=True)
        else:
            self.deadline = min(self.deadline, time.monotonic() + LAST_CHANCE_SECONDS)
        self.forward(signum)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


def send(procs, signum: int) -> None:
    """`signum` to each process still running (one that just ended is no error)."""
    for proc in procs:
        try:
            if proc.poll() is None:
                proc.send_signal(signum)
        except ProcessLookupError:
            pass


def node_tag(launch_id: str, node_rank: int) -> str:
    """The tag of one node's workers in a launch over pdsh: `tagged(launch_id)` includes them,
    `tagged(node_tag(...))` finds only them (several "nodes" may share a machine)."""
    return f"{launch_id}-node{node_rank}"


def tagged(launch_id: str) -> list[psutil.Process]:
    """This machine's processes of the launch `launch_id`, its node tags included (this user's;
    others' are unreadable)."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter():
        try:
            tag = proc.environ().get(LAUNCH_ID_VAR, "") if proc.pid != me else ""
            if tag == launch_id or tag.startswith(launch_id + "-node"):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def kill_tagged(launch_id: str) -> int:
    """SIGKILL every process of the launch still alive here; how many there were."""
    procs = tagged(launch_id)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def exit_description(returncode: int) -> str:
    """Popen's return code in words: 'exited with status 1', 'killed by SIGKILL'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


def shell_status(returncode: int) -> int:
    """The status a shell reports for a process: 128 + N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode
