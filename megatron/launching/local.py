"""Starting this machine's workers from deepy.py and watching them until the run ends (A34).

Used without a hostfile, and with `no_ssh` (deepy.py run once per node with its `node_rank`).
Each worker gets the variables DeepSpeed's per-node launcher would set: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, CROSS_RANK (this node's index), CROSS_SIZE (nodes), MASTER_ADDR,
MASTER_PORT and the device list (CUDA_VISIBLE_DEVICES), plus NEOX_LAUNCH_ID, the tag by which
leftovers are found. Workers run in their own session and get SIGTERM should deepy.py itself
die (Linux's parent-death signal), so none outlives it. Their stdout and stderr come back
through pipes and are printed as they come, except that a warning several ranks print alike is
printed once, naming them (megatron.launching.merge).

When a worker fails on its own, one line says which, where and how, after whatever it printed
last; workers that fail alike at once share the line:

    worker rank 1 (local rank 1) on node-a died: killed by SIGKILL
    worker ranks 0-1 (local ranks 0-1) on node-a died: exited with status 1

A worker that said why it stopped (its `error (rank R on HOST): ...` line, megatron.entry) and
exited with a status gets no such line: its error is the one line of the event, printed once
for the ranks that met it (`error (ranks 0-1 on node-a): checkpoint ck/global_step2 is damaged
...`). A signal, a crash with a traceback, or a status without an error line is reported. Under
pdsh (`abort_signal`) every death is reported: deepy.py reads the node launcher's lines for the
run's status and leaves out the explained ones there (megatron.launching.pdsh).

The others are stopped: SIGTERM, FAILURE_GRACE_SECONDS, then SIGKILL (they cannot save without
the dead one: a checkpoint is written by all ranks together). A worker that exits with 143, 130
or 138 stopped on a signal of its own after saving (megatron.safety.signals); the others follow
after the same step, so they are left to finish. The status of the run:

    0          every worker exited 0
    128 + S    deepy.py received signal S (SIGTERM: 143, SIGINT: 130), whatever the workers did
    N          otherwise, the first failed worker's status, 128 + S for one killed by signal S
               (SIGKILL: 137; the 124 of the hang watchdog and of the rendezvous deadline,
               a preemption's 143 pass through)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from megatron.host import cuda_available
from megatron.launching.merge import WarningMerger, pipe_lines
from megatron.launching.stopping import (LAUNCH_ID_VAR, DeepySignals, exit_description, send,
                                         shell_status)
from megatron.monitoring.logger import who
from megatron.monitoring.progress import ENV as PROGRESS_ENV
from megatron.safety.signals import STOP_STATUSES

FAILURE_GRACE_SECONDS = 30.0
READER_WAIT_SECONDS = 5.0  # for the workers' last output once they ended
DEATH_WAIT_SECONDS = 1.0  # for other workers failing alike, and the dead ones' last output
PREEMPTED = STOP_STATUSES  # a worker's own orderly stop (megatron.safety.signals)
POLL_SECONDS = 0.2
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LocalLaunch:
    """The workers of this node: which global ranks, on which devices, in which world."""

    host: str
    node_rank: int
    nnodes: int
    world_size: int
    ranks: tuple[int, ...]  # global rank of each local rank
    device_ids: tuple[int, ...]
    master_addr: str
    master_port: int


def local_launch(hosts: dict[str, list[int]], node_rank: int, master_addr: str,
                 master_port: int) -> LocalLaunch:
    """This node's share of `hosts` (ranks numbered in hostfile order, as DeepSpeed does)."""
    names = list(hosts)
    if not 0 <= node_rank < len(names):
        raise ValueError(f"node_rank({node_rank}) must be in [0, {len(names)}): the hostfile's "
                         f"selection has {len(names)} node(s)")
    first = sum(len(hosts[h]) for h in names[:node_rank])
    here = hosts[names[node_rank]]
    host = names[node_rank] if len(names) > 1 else socket.gethostname()
    return LocalLaunch(host=host, node_rank=node_rank, nnodes=len(names),
                       world_size=sum(len(s) for s in hosts.values()),
                       ranks=tuple(range(first, first + len(here))), device_ids=tuple(here),
                       master_addr=master_addr, master_port=master_port)


# the variable DeepSpeed's CPU accelerator names the devices in (its visible_devices_envs())
CPU_VISIBLE_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"


def worker_env(base: dict[str, str], launch: LocalLaunch, local_rank: int,
               launch_id: str) -> dict[str, str]:
    """The environment of the worker with `local_rank` on this node."""
    env = {**base, "RANK": str(launch.ranks[local_rank]), "LOCAL_RANK": str(local_rank),
           "WORLD_SIZE": str(launch.world_size), "LOCAL_SIZE": str(len(launch.ranks)),
           "CROSS_RANK": str(launch.node_rank), "CROSS_SIZE": str(launch.nnodes),
           "MASTER_ADDR": launch.master_addr, "MASTER_PORT": str(launch.master_port),
           LAUNCH_ID_VAR: launch_id}
    if base.get("DS_ACCELERATOR") == "cpu":  # what DeepSpeed's CPU accelerator sets, without
        env[CPU_VISIBLE_DEVICES_VAR] = ",".join(map(str, launch.device_ids))  # importing it
        return env
    from deepspeed.accelerator import get_accelerator

    get_accelerator().set_visible_devices_envs(env, list(launch.device_ids))
    return env


def death_line(launch: LocalLaunch, local_ranks: int | list[int], returncode: int) -> str:
    """'worker rank 3 (local rank 1) on node-b died: killed by SIGKILL'; for several workers
    that ended alike, 'worker ranks 2-3 (local ranks 0-1) on node-b died: ...'."""
    local = [local_ranks] if isinstance(local_ranks, int) else sorted(local_ranks)
    return (f"worker {who([launch.ranks[r] for r in local])} (local {who(local)}) on "
            f"{launch.host} died: {exit_description(returncode)}")


def run_local(argv: list[str], env: dict[str, str], launch: LocalLaunch, grace_seconds: float,
              launch_id: str, abort_signal: int | None = None, on_stop: str = "which stop") -> int:
    """Start `argv` once per local rank, watch the workers, return the run's status.

    `abort_signal` (the node launcher of a pdsh launch: SIGUSR1) says that a worker on another
    node failed: the workers here are stopped as after a local worker's death."""
    procs: list[subprocess.Popen] = []
    output = _Output(launch.ranks)
    watch = _Watch(launch, procs, output, report_explained=bool(abort_signal))
    if sys.stderr.isatty() and PROGRESS_ENV not in env:
        env = {**env, PROGRESS_ENV: "1"}  # rank 0's bars reach this terminal through the pipe
    previous = signal.signal(abort_signal, watch.note_abort) if abort_signal else None
    try:
        with DeepySignals(grace_seconds, lambda signum: send(procs, signum),
                          announce=not abort_signal, on_stop=on_stop) as signals:
            try:
                for local_rank, rank in enumerate(launch.ranks):
                    with output.pipes(rank) as (out, err):
                        procs.append(subprocess.Popen(
                            argv, env=worker_env(env, launch, local_rank, launch_id),
                            stdout=out, stderr=err, start_new_session=True,
                            preexec_fn=_die_with_parent))
                return watch.until_done(signals)
            finally:
                # the workers' last lines are read with the handlers still in place: a signal
                # that comes as the workers end (a pdsh launch's stop reaching a node launcher
                # whose workers already agreed to stop) would otherwise end this process first
                output.close()
    finally:
        if abort_signal:
            signal.signal(abort_signal, previous)


class _Output:
    """The workers' stdout and stderr, copied to deepy.py's; warnings alike on several ranks
    printed once (megatron.launching.merge)."""

    def __init__(self, ranks):
        self.merger = WarningMerger(sys.stderr, ranks)
        self.readers: list[tuple[int, threading.Thread]] = []  # (rank, reader)

    @contextlib.contextmanager
    def pipes(self, rank: int):
        """(stdout, stderr) write ends for the worker of `rank`; closed here once it started."""
        ends = [os.pipe(), os.pipe()]
        try:
            yield ends[0][1], ends[1][1]
        except BaseException:
            for r, _w in ends:
                os.close(r)
            raise
        finally:
            for _r, w in ends:
                os.close(w)
        for (r, _w), out, plain in zip(ends, (sys.stdout, sys.stderr), (True, False)):
            # stdout's lines are never merged, only kept behind the rank's held warnings
            reader = threading.Thread(target=pipe_lines, args=(r, out, self.merger, rank, plain),
                                      name=f"output-rank{rank}", daemon=True)
            reader.start()
            self.readers.append((rank, reader))

    def settle(self, ranks: set[int]) -> None:
        """Before the deaths of `ranks` are reported: their last output read (briefly: a child
        of theirs may hold a pipe open) and every line held printed, so that the error a worker
        ended on comes before the line saying it died."""
        deadline = time.monotonic() + DEATH_WAIT_SECONDS
        for rank, reader in self.readers:
            if rank in ranks:
                reader.join(max(0.0, deadline - time.monotonic()))
        self.merger.flush()

    def close(self) -> None:
        """Wait briefly for what the workers wrote last (a leftover child holding a pipe open is
        swept by the launcher), then print the warnings still held."""
        deadline = time.monotonic() + READER_WAIT_SECONDS
        for _rank, reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self.merger.close()


class _Watch:
    """Polls the workers: reports failures, stops the rest, kills at the deadline."""

    def __init__(self, launch: LocalLaunch, procs: list[subprocess.Popen], output: _Output,
                 report_explained: bool = False):
        self.launch, self.procs, self.output = launch, procs, output
        self.report_explained = report_explained  # a node launcher's: deepy.py reads them
        self.ended: set[int] = set()
        self.first_failure = 0
        self.deadline: float | None = None
        self.stopping = False
        self.aborted = False  # a worker on another node failed

    def note_abort(self, signum: int, frame) -> None:
        self.aborted = True

    def alive(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def until_done(self, signals: DeepySignals) -> int:
        while self.alive() or len(self.ended) < len(self.procs):
            deaths = self._note_ended(orderly=bool(signals.signum) or self.stopping)
            if (deaths or self.aborted) and not self.stopping:
                self._stop_the_rest(f"a worker on another node failed: stopping the "
                                    f"{{n}} worker(s) on {self.launch.host}" if not deaths
                                    else "deepy.py: stopping the other {n} worker(s)")
            elif self.first_failure in PREEMPTED and self.deadline is None:
                self.deadline = time.monotonic() + signals.grace  # the others follow
            late = self.deadline is not None and time.monotonic() > self.deadline
            if (signals.expired() or late) and self.alive():
                self._kill_the_rest(signals)
            time.sleep(POLL_SECONDS)
        return 128 + signals.signum if signals.signum else self.first_failure

    def _note_ended(self, orderly: bool) -> int:
        """Record workers that ended since the last poll; print a line per way of failing,
        except for workers whose error line already said why. Workers failing alike within
        DEATH_WAIT_SECONDS of the first (an error every rank meets) share the line, after what
        they printed last; one killed by a signal meanwhile is reported too, and one ending
        otherwise meanwhile (failing because its peer is gone) is left to be stopped with the
        rest."""
        deaths = self._ended_since_last_poll(orderly)
        if not deaths:
            return 0
        deadline = time.monotonic() + DEATH_WAIT_SECONDS
        while self.alive() and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS / 4)
        for returncode, local_ranks in self._ended_since_last_poll(orderly, set(deaths)).items():
            deaths.setdefault(returncode, []).extend(local_ranks)
        self.output.settle({self.launch.ranks[r] for group in deaths.values() for r in group})
        for returncode, local_ranks in deaths.items():
            unexplained = [r for r in local_ranks if not self._explained(r, returncode)]
            if unexplained:
                print(death_line(self.launch, unexplained, returncode), file=sys.stderr,
                      flush=True)
        return sum(len(group) for group in deaths.values())

    def _explained(self, local_rank: int, returncode: int) -> bool:
        """Whether the worker's own error line says why it ended: it printed one and exited
        with a status (megatron.entry.run_entry), not on a signal."""
        return (not self.report_explained and returncode > 0
                and self.output.merger.said_why([self.launch.ranks[local_rank]]))

    def _ended_since_last_poll(self, orderly: bool,
                               only: set[int] | None = None) -> dict[int, list[int]]:
        """{returncode: local ranks} of the workers that failed since the last look (none when
        `orderly`: a stop deepy.py asked for), recording every worker that ended (with `only`,
        those that ended with one of these return codes or on a signal)."""
        deaths: dict[int, list[int]] = {}
        for local_rank, proc in enumerate(self.procs):
            if local_rank in self.ended or proc.poll() is None:
                continue
            if only is not None and proc.returncode not in only and proc.returncode > 0:
                continue
            self.ended.add(local_rank)
            if proc.returncode == 0:
                continue
            status = shell_status(proc.returncode)
            self.first_failure = self.first_failure or status
            if not orderly and status not in PREEMPTED:
                deaths.setdefault(proc.returncode, []).append(local_rank)
        return deaths

    def _stop_the_rest(self, what: str) -> None:
        """SIGTERM to the workers still running, SIGKILL at the deadline; `what` says why, with
        {n} for how many."""
        self.stopping = True
        alive = self.alive()
        if alive:
            print(f"{what.format(n=len(alive))}: SIGTERM, then SIGKILL after "
                  f"{FAILURE_GRACE_SECONDS:g} s", file=sys.stderr, flush=True)
            send(alive, signal.SIGTERM)
            send(alive, signal.SIGCONT)  # a stopped worker acts on it (and finds its peer gone)
        self.deadline = time.monotonic() + FAILURE_GRACE_SECONDS

    def _kill_the_rest(self, signals: DeepySignals) -> None:
        alive = self.alive()
        ranks = ", ".join(str(self.launch.ranks[self.procs.index(p)]) for p in alive)
        waited = ("signal_grace_seconds" if signals.signum and not self.stopping
                  else "the grace time")
        print(f"deepy.py: worker rank(s) {ranks} did not exit within {waited}: killing them "
              "(SIGKILL)", file=sys.stderr, flush=True)
        send(alive, signal.SIGKILL)
        for proc in alive:
            proc.wait()
        self.stopping = True


def name_cpu_accelerator(environ) -> None:
    """On a machine without CUDA, tell DeepSpeed its accelerator is the CPU (DS_ACCELERATOR),
    unless the user chose one: its detection otherwise warns "Setting accelerator to CPU" once
    per process. Detection under CUDA is left to DeepSpeed."""
    if "DS_ACCELERATOR" not in environ and not cuda_available():
        environ["DS_ACCELERATOR"] = "cpu"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when deepy.py ends, however it ends (Linux only)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
