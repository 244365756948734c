"""Running DeepSpeed's multi-node runner (pdsh, mpirun, srun) from deepy.py: its output relayed
without secrets or the encoded config, worker deaths said in one line, signals passed on.

    status = run_runner(argv, env, grace_seconds, launch_id, Redactor(secrets, [encoded]), world)

Every line the runner and its launchers print passes through `Redactor` (the config blob
becomes `<config>`, an exported value `K=<hidden>`). Their reports of a dead worker become the
one-line form of local launches, with what each launcher tells:

    DeepSpeed's per-node launcher (pdsh)  "a worker on HOST died: killed by SIGKILL (...)"
    mpirun                                "worker rank 1 on HOST died: killed by SIGKILL"
    srun                                  "worker rank 1 on HOST died: exited with status 1"

SIGTERM / SIGINT to deepy.py would make mpirun and srun end their processes at once, without
their checkpoint; both pass SIGUSR1 on to every process, so deepy.py sends them SIGUSR1
instead, which workers take as a stop request like SIGTERM (megatron.safety.signals). deepy.py
waits for the runner and for the launch's processes on this machine, up to
`signal_grace_seconds`, then kills what is left here. Processes left on other nodes are the
launcher's to stop.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

import psutil

from megatron.launching.merge import WarningMerger, parse_ranks
from megatron.launching.secrets import Redactor
from megatron.launching.stopping import DeepySignals, exit_description, shell_status, tagged
from megatron.safety.signals import STOP_STATUSES

POLL_SECONDS = 0.2
# DeepSpeed's launch.py: "[...] exits with return code = -9", behind pdsh's "host: " prefix
DEEPSPEED_EXIT = re.compile(r"^(?:(?P<host>[\w.\-]+): )?.*exits with return code = (?P<rc>-?\d+)")
# mpirun: "mpirun noticed that process rank 1 with PID 42 on node n1 exited on signal 9 (Killed).",
# which Open MPI wraps over two lines
MPIRUN_SIGNAL = re.compile(r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) "
                           r"exited on\s+signal (?P<sig>\d+)")
MPIRUN_WRAPPED = re.compile(r"process rank \d+ with PID \d+ on node \S+( exited( on)?)?$")
# srun: "srun: error: n1: task 1: Killed" / "...: task 1: Exited with exit code 1"
SRUN_TASK = re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<rank>[\d\-,]+): (?P<what>.+)$")
SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")
# DeepSpeed's runner naming the file of exported variables deepy.py wrote (DS_ENV_FILE, an
# absolute path it joins to both of its folders, so it is read and named twice)
DS_ENV_NOTE = re.compile(r"\] deepspeed_env file = \S*/neox_env_\w+$")


def describe_runner_line(line: str) -> str | None:
    """The one-line death report for a launcher's line about a dead worker ("" for srun's report
    of tasks that stopped after saving), else None."""
    m = MPIRUN_SIGNAL.search(line)
    if m:
        return f"worker rank {m['rank']} on {m['host']} died: {exit_description(-int(m['sig']))}"
    m = SRUN_TASK.match(line)
    if m:
        code = SRUN_EXIT.search(m["what"])
        if code and int(code.group(1)) in STOP_STATUSES:
            return ""  # the tasks stopped on a signal after saving: not a death
        how = exit_description(int(code.group(1))) if code else _srun_signal(m["what"])
        return f"worker rank {m['rank']} on {m['host']} died: {how}"
    m = DEEPSPEED_EXIT.match(line)
    if m and int(m["rc"]) != 0:
        where = f" on {m['host']}" if m["host"] else ""
        return (f"a worker{where} died: {exit_description(int(m['rc']))} (DeepSpeed's launcher "
                "does not say which rank; look for its 'error (rank R on HOST)' line above)")
    return None


def _srun_signal(what: str) -> str:
    """srun names a signal by its description ("Killed", "Terminated", "Segmentation fault")."""
    for sig in signal.Signals:
        if signal.strsignal(sig) == what.strip():
            return f"killed by {sig.name}"
    return what.strip().lower()


def relay(stream, out, redactor: Redactor,
          rewrite: Callable[[str], str | None] | None = None,
          merger: WarningMerger | None = None) -> threading.Thread:
    """A thread copying `stream` to `out` line by line, cleaned and with deaths reworded
    (`rewrite` first: a line to print instead, "" to drop it, None to leave it to the rest);
    with `merger` (writing to `out`), warnings alike on several ranks are printed once."""
    held: list[str] = []  # the first part of a report wrapped over two lines

    def emit(line: str) -> None:
        if held:
            line = f"{held.pop()} {line}"
        elif MPIRUN_WRAPPED.search(line):
            held.append(line)
            return
        if DS_ENV_NOTE.search(line):
            return  # deepy.py's own file of the workers' variables, which DeepSpeed reads twice
        text = rewrite(line) if rewrite else None
        if text is None and merger is not None and _explained_srun_exit(line, merger):
            return  # the tasks' own error lines said why they exited
        if text is None:
            text = describe_runner_line(line)
        if text == "":  # a report that says nothing here (dropped)
            return
        if merger is not None:
            if text is not None:  # a death: the errors held so far come before it
                merger.flush()
            merger.feed(None, line if text is None else text)
        else:
            out.write((line if text is None else text) + "\n")
            out.flush()

    def copy() -> None:
        box: list[str] | None = None  # an mpirun message between two rules of dashes
        for raw in iter(stream.readline, b""):
            line = redactor.clean(raw.decode("utf-8", errors="replace")).rstrip("\n")
            if MPIRUN_RULE.match(line) and box is None:
                box = [line]
            elif box is not None:
                box.append(line)
                if MPIRUN_RULE.match(line):
                    ended, box = box, None
                    if _orderly_stop_box(ended) or _explained_exit_box(ended, merger):
                        continue
                    if merger is not None:  # mpirun's report of a death: the errors first
                        merger.flush()
                    for boxed in ended:
                        emit(boxed)
            else:
                emit(line)
        for rest in held + (box or []):
            out.write(rest + "\n")
        out.flush()
        stream.close()

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


MPIRUN_NAMES = ("mpirun", "mpiexec", "prterun", "mpiexec.hydra", "orterun", "srun")
# Open MPI frames its messages between rules of dashes; the one about the first process to
# exit with a non-zero status says nothing more when that status was a stop after saving
MPIRUN_RULE = re.compile(r"^-{20,}$")
MPIRUN_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(\d+)")
# its name of that process, ending in the rank: "[prterun-vm-5431@1,1]" (Open MPI 5, run here);
# Open MPI 4 writes "[[37934,1],0]" (read alike, not run here)
MPIRUN_PROCESS = re.compile(r"^\s*Process name:\s*\[.*,(\d+)\]+\s*$")


def _orderly_stop_box(lines: list[str]) -> bool:
    """Whether an mpirun message box only reports a worker's exit after a stop signal."""
    text = " ".join(lines)
    codes = [int(m.group(1)) for m in map(MPIRUN_EXIT_CODE.match, lines) if m]
    return ("exited with non-zero status" in text and bool(codes)
            and all(c in STOP_STATUSES for c in codes))


def _explained_exit_box(lines: list[str], merger: WarningMerger | None) -> bool:
    """Whether an mpirun message box only reports processes that exited with a status (not a
    signal) after printing their own error line, which said why."""
    codes = [int(m.group(1)) for m in map(MPIRUN_EXIT_CODE.match, lines) if m]
    ranks = [int(m.group(1)) for m in map(MPIRUN_PROCESS.match, lines) if m]
    return (merger is not None and "exited with non-zero status" in " ".join(lines)
            and bool(codes) and bool(ranks) and all(0 < c < 128 for c in codes)
            and merger.said_why(ranks))


def _explained_srun_exit(line: str, merger: WarningMerger) -> bool:
    """Whether `line` is srun's report of tasks that exited with a status (not a signal) after
    printing their own error line."""
    m = SRUN_TASK.match(line)
    code = SRUN_EXIT.search(m["what"]) if m else None
    return (code is not None and 0 < int(code.group(1)) < 128
            and merger.said_why(parse_ranks(m["rank"])))


def run_runner(argv: list[str], env: dict[str, str], grace_seconds: float, launch_id: str,
               redactor: Redactor, world_size: int, through_mpirun: bool = False,
               on_stop: str = "which stop") -> int:
    """Run DeepSpeed's runner `argv` to its end; the run's status (see launch_local for 128+S).
    `through_mpirun`: the runner starts mpirun or srun, which gets deepy.py's stop as SIGUSR1."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    merger = WarningMerger(sys.stderr, range(world_size))
    threads = [relay(proc.stdout, sys.stdout, redactor),
               relay(proc.stderr, sys.stderr, redactor, merger=merger)]

    def forward(signum: int) -> None:
        mpiruns = _mpiruns(proc.pid) if through_mpirun else []
        for mpirun in mpiruns:
            try:
                mpirun.send_signal(signal.SIGUSR1)
            except psutil.Error:
                pass
        if not mpiruns:
            signal_group(proc.pid, signum)

    with DeepySignals(grace_seconds, forward, on_stop=on_stop) as signals:
        while proc.poll() is None or (signals.signum and not signals.expired()
                                      and tagged(launch_id)):
            if signals.expired() and proc.poll() is None:
                print("deepy.py: the launcher did not stop within signal_grace_seconds: killing "
                      "it (SIGKILL)", file=sys.stderr, flush=True)
                signal_group(proc.pid, signal.SIGKILL)
            time.sleep(POLL_SECONDS)
        drain(proc, threads, merger)  # with the handlers in place (local.run_local says why)
    if signals.signum:
        return 128 + signals.signum
    return shell_status(proc.returncode)


def _mpiruns(pid: int) -> list:
    """The mpirun / srun processes the runner `pid` started."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if child.name() in MPIRUN_NAMES:
                found.append(child)
        except psutil.Error:
            continue
    return found


def drain(proc: subprocess.Popen, threads, merger: WarningMerger) -> None:
    """After the launcher process (DeepSpeed's runner, pdsh) ended: what its session left
    killed, its last output read and every line the merger holds printed."""
    signal_group(proc.pid, signal.SIGKILL)
    for thread in threads:
        thread.join(timeout=10)
    merger.close()


def signal_group(pgid: int, signum: int) -> None:
    """`signum` to the process group `pgid`; one already gone is no error."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
