"""The hang watchdog: a step, checkpoint save or load that runs past its limit ends the job,
saying on every live rank what it was doing, its stack, and which ranks stopped progressing (A4).

    with watchdog.running(args, rank, world_size):     # once per process, around the run
        with watchdog.phase("train step", iteration):  # the loop, around each watched phase
            ...

Watched phases and their limits (training section of the config):

- "train step", "eval step", "stop check" (the all-reduce after each step that agrees on a stop
  signal: a peer stopped just after the step's last collective leaves this rank waiting there):
  max(hang_timeout_minutes, hang_step_factor x the median train step so far). The first train
  step after start-up includes warm-up and may also take hang_timeout_checkpoint_minutes.
- "checkpoint save", "checkpoint load": hang_timeout_checkpoint_minutes (0 or null: not watched).

Start-up before the first phase and the loop's work between phases are not watched. A
hang_timeout_minutes of 0 or null starts no watchdog.

A daemon thread checks the current phase. Past its limit, the rank writes to stderr one line
"rank R (host H, pid P): iteration N, phase P has run X s (limit Y s), <where it waits>", the
stack of every thread (faulthandler), and what the heartbeat files (`heartbeat`) say about the
other ranks: which are not progressing and where the rest are. It then exits with code 124
(os._exit: the training thread is blocked and cannot unwind), and the launcher stops the other
workers. Every rank that is still running reaches its own limit and reports the same way; a
stopped rank cannot, which is why each healthy rank names it from the heartbeats.

A hang inside one collective is also ended by the process-group timeout
(distributed_timeout_minutes, applied to every group); the watchdog reports it first while its
limit is the shorter. Otherwise the rank whose collective timed out prints, before its error,
where it waited and where the other ranks' last heartbeats put them (`last_beats`: one reading,
at once), each line starting "collective timeout:".
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import socket
import statistics
import sys
import sysconfig
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from megatron.exit_codes import TIMED_OUT
from megatron.monitoring.logger import get_logger
from megatron.monitoring.errors import collective_timeout
from megatron.safety.heartbeat import FINISHED, PeerReport, last_beats, read_beats, write_beat

log = get_logger(__name__)

EXIT_CODE = TIMED_OUT
STEP_PHASES = ("train step", "eval step", "stop check")
CHECKPOINT_PHASES = ("checkpoint save", "checkpoint load")
STEP_WINDOW = 100  # train steps the median is taken over

# sys._current_frames() keeps the interpreter's list of threads locked while it builds frame
# objects, which may run the garbage collector, whose finalizers may let other threads run. A
# fork at that moment (a DataLoader starting its workers) leaves the child blocked on that lock
# for ever on Python 3.11. Frames are therefore read under a lock that os.fork() takes first.
_FRAMES_LOCK = threading.Lock()
_FORKS_GUARDED: list[bool] = []


def _guard_forks() -> None:
    """Make os.fork() wait for a frames read in progress (registered once per process)."""
    if not _FORKS_GUARDED:
        os.register_at_fork(before=_FRAMES_LOCK.acquire, after_in_parent=_FRAMES_LOCK.release,
                            after_in_child=_FRAMES_LOCK.release)
        _FORKS_GUARDED.append(True)


def thread_frame(ident: int):
    """The current frame of the thread `ident` (None when it has ended), safe beside forks."""
    _guard_forks()
    with _FRAMES_LOCK:
        return sys._current_frames().get(ident)


@dataclass(frozen=True)
class Limits:
    """The configured limits, in seconds; `checkpoint` None: saves and loads are not watched."""

    step: float
    step_factor: float
    checkpoint: float | None

    @classmethod
    def from_training(cls, training) -> "Limits | None":
        """None when hang_timeout_minutes is 0 or null (no watchdog)."""
        if not training.hang_timeout_minutes:
            return None
        ckpt = training.hang_timeout_checkpoint_minutes
        return cls(training.hang_timeout_minutes * 60.0, training.hang_step_factor,
                   ckpt * 60.0 if ckpt else None)

    def of(self, phase: str, median_step: float | None) -> float | None:
        """The limit of `phase` given the median train step so far (None before the first)."""
        if phase in CHECKPOINT_PHASES:
            return self.checkpoint
        if phase not in STEP_PHASES:
            raise ValueError(f"the watchdog knows no phase {phase!r}; watched phases: "
                             f"{', '.join(STEP_PHASES + CHECKPOINT_PHASES)}")
        if median_step is None:  # warm-up
            return max(self.step, self.checkpoint or 0.0)
        return max(self.step, self.step_factor * median_step)


@dataclass(frozen=True)
class _Phase:
    name: str
    iteration: int | None
    started: float  # time.monotonic()
    limit: float | None
    thread: int  # ident of the thread that runs it

    def describe(self) -> str:
        return (f"iteration {self.iteration}, phase {self.name}" if self.iteration is not None
                else f"phase {self.name}")


class Watchdog:
    """One rank's watchdog thread and heartbeat (see the module docstring)."""

    def __init__(self, limits: Limits, rank: int, world_size: int,
                 heartbeat_dir: str | Path | None = None):
        self.limits, self.rank, self.world_size = limits, rank, world_size
        self.heartbeat_dir = Path(heartbeat_dir) if heartbeat_dir else None
        self.host, self.pid = socket.gethostname(), os.getpid()
        # checks every `tick` s, rewrites the heartbeat every `interval` s
        self.tick = min(1.0, max(0.05, limits.step / 60))
        self.interval = min(10.0, max(0.2, limits.step / 30))
        # two readings of the peers' heartbeats this far apart tell who stopped writing
        self.report_wait = 3 * self.interval + 0.5
        self._snapshot: tuple[_Phase, float, dict] | None = None  # a first reading near a limit
        self._current: _Phase | None = None
        self._last = _Phase("start-up", None, time.monotonic(), None, threading.get_ident())
        self._steps: deque[float] = deque(maxlen=STEP_WINDOW)
        self._stop, self._expired = threading.Event(), threading.Event()
        self._beats = 0
        self._threads: list[threading.Thread] = []
        self._failed: _Phase | None = None

    @classmethod
    def from_args(cls, args, rank: int, world_size: int) -> "Watchdog | None":
        limits = Limits.from_training(args.training)
        if limits is None:
            return None
        log_dir = args.logging.log_dir
        return cls(limits, rank, world_size, Path(log_dir) / "heartbeats" if log_dir else None)

    def start(self) -> None:
        _guard_forks()  # before the threads that read frames start
        if self.heartbeat_dir is not None:
            try:
                self.heartbeat_dir.mkdir(parents=True, exist_ok=True)
                self._write_beat()  # the first one at once: peers find this rank from now on
            except OSError as err:
                self._no_heartbeat(err)
                self.heartbeat_dir = None
        for target, name in ((self._watch, "hang-watchdog"), (self._beat_loop, "heartbeat")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """End both threads and leave a last heartbeat saying this rank finished."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._last = _Phase(FINISHED, self._last.iteration, time.monotonic(), None,
                            threading.get_ident())
        if self.heartbeat_dir is not None:
            with contextlib.suppress(OSError):  # the run's own outcome matters more
                self._write_beat()

    @contextlib.contextmanager
    def phase(self, name: str, iteration: int | None = None):
        """Watch the body as `name` at `iteration`; a train step's time enters the median."""
        median = statistics.median(self._steps) if self._steps else None
        current = _Phase(name, iteration, time.monotonic(), self.limits.of(name, median),
                         threading.get_ident())
        self._current, self._failed = current, None
        try:
            yield
        except BaseException:
            self._failed = current  # what a report of the error names
            raise
        finally:
            self._current = None
            self._last = dataclasses.replace(current, name=f"after {name}",
                                             started=time.monotonic(), limit=None)
            if self._expired.is_set():  # the report is being written and ends the process
                self._threads[0].join()
        if name == "train step":
            self._steps.append(time.monotonic() - current.started)

    def _watch(self) -> None:
        while not self._stop.wait(self.tick):
            current = self._current
            if current is None or current.limit is None:
                continue
            elapsed = time.monotonic() - current.started
            if elapsed > current.limit:
                self._expire(current, elapsed)

    def _beat_loop(self) -> None:
        warned = False
        while self.heartbeat_dir is not None and not self._stop.wait(self.interval):
            try:
                self._write_beat()
                self._snapshot_near_limit()
            except OSError as err:
                if not warned:
                    self._no_heartbeat(err)
                warned = True

    def _no_heartbeat(self, err: OSError) -> None:
        log.warning("rank %d cannot write its heartbeat in %s (%s); other ranks cannot tell "
                    "whether it progresses", self.rank, self.heartbeat_dir, err)

    def _write_beat(self) -> None:
        current = self._current or self._last
        self._beats += 1
        write_beat(self.heartbeat_dir, {
            "rank": self.rank, "host": self.host, "pid": self.pid,
            "iteration": current.iteration, "phase": current.name,
            "seconds": round(time.monotonic() - current.started, 3),
            "where": waiting_in(thread_frame(current.thread)),
            "beat": self._beats})

    def _snapshot_near_limit(self) -> None:
        """Read the peers' heartbeats once when the current phase nears its limit, so that at
        expiry a second reading names the stopped ranks without waiting."""
        current, snapshot = self._current, self._snapshot
        if (current is None or current.limit is None
                or (snapshot is not None and snapshot[0] is current)
                or time.monotonic() - current.started < current.limit - self.report_wait):
            return
        self._snapshot = (current, time.monotonic(),
                          read_beats(self.heartbeat_dir, self.world_size))

    def _expire(self, current: _Phase, elapsed: float) -> None:
        """Report this rank, its stack and its peers on stderr, then end the process."""
        self._expired.set()
        where = waiting_in(thread_frame(current.thread))
        _say(f"hang watchdog: rank {self.rank} (host {self.host}, pid {self.pid}): "
             f"{current.describe()} has run {elapsed:.1f} s (limit {current.limit:.1f} s), "
             f"{where}\nhang watchdog: the stack of every thread of rank {self.rank}:\n")
        faulthandler.dump_traceback(file=2, all_threads=True)
        _say("".join(f"hang watchdog: {line}\n" for line in self._peer_lines(current)))
        key = ("hang_timeout_checkpoint_minutes" if current.name in CHECKPOINT_PHASES
               else "hang_timeout_minutes / hang_step_factor")
        _say(f"hang watchdog: rank {self.rank} exits with code {EXIT_CODE}; if this phase can "
             f"legitimately take longer, raise {key}\n")
        os._exit(EXIT_CODE)

    def _peer_lines(self, current: _Phase) -> list[str]:
        """What the heartbeats say, two readings apart (_observe_peers)."""
        return self._read_beats_within(lambda: self._observe_peers(current),
                                       self.report_wait + 30.0)

    def _read_beats_within(self, read, seconds: float) -> list[str]:
        """`read()`'s lines, run in a helper thread: a hung filesystem must not keep this rank
        from exiting."""
        if self.heartbeat_dir is None:
            return ["other ranks are not named: heartbeats need log_dir to be set"]
        box: list[list[str]] = []
        reader = threading.Thread(target=lambda: box.append(read()), daemon=True)
        reader.start()
        reader.join(seconds)
        return box[0] if box else [f"the heartbeat files in {self.heartbeat_dir} could not be "
                                   f"read within {seconds:g} s"]

    def report_collective_timeout(self, err: BaseException, waited: float) -> None:
        """On stderr, after a collective of this rank timed out: where this rank waited, then
        where the other ranks' last heartbeats put them, read at once (the rank that never
        joined is usually the one elsewhere)."""
        failed = self._failed or self._current or self._last
        tb = err.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = waiting_in(tb.tb_frame if tb is not None else None)
        lines = [f"rank {self.rank} (host {self.host}, pid {self.pid}) waited {waited:g} s "
                 f"(distributed_timeout_minutes) at {failed.describe()}, {where}; the "
                 "other ranks' last heartbeats:"]
        lines += self._read_beats_within(
            lambda: last_beats(self.heartbeat_dir, self.world_size, self.rank, self.host), 30.0)
        _say("".join(f"collective timeout: {line}\n" for line in lines))

    def _observe_peers(self, current: _Phase) -> list[str]:
        """Two readings `report_wait` apart: the snapshot taken near the limit (or one now),
        and one after."""
        snapshot = self._snapshot
        if snapshot is not None and snapshot[0] is current:
            taken, first = snapshot[1], snapshot[2]
        else:
            taken, first = time.monotonic(), read_beats(self.heartbeat_dir, self.world_size)
        time.sleep(max(0.0, taken + self.report_wait - time.monotonic()))
        second = read_beats(self.heartbeat_dir, self.world_size)
        report = PeerReport.compare(first, second, self.world_size, self.rank)
        return report.lines(self.heartbeat_dir)


def _say(text: str) -> None:
    """Straight to file descriptor 2: no logging lock the blocked thread might hold."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    with contextlib.suppress(OSError):  # deepy.py's end of the pipe may be gone: exit anyway
        os.write(2, text.encode("utf-8", "replace"))


_COMM_DIRS = (f"{os.sep}torch{os.sep}distributed{os.sep}", f"{os.sep}deepspeed{os.sep}comm{os.sep}")
_PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGES = f"site-packages{os.sep}"
_LOADER = os.path.join("torch", "utils", "data", "dataloader.py")
_STDLIB = sysconfig.get_paths()["stdlib"]


def waiting_in(frame) -> str:
    """Where a thread is: 'in torch.distributed.all_reduce, called at deepspeed/runtime/
    engine.py:2345 (allreduce_bucket)', 'in torch's DataLoader (waiting for a batch), called at
    megatron/training/data.py:45 (<genexpr>)' or 'at threading.py:331 (wait)', then the
    innermost frame of this project's code when that is another: 'from megatron/training/
    step.py:57 (train_step)'."""
    if frame is None:
        return "not running Python code"
    where, waits_for, inner = None, None, frame
    while frame is not None:
        path = frame.f_code.co_filename
        if any(d in path for d in _COMM_DIRS):
            if path.endswith("distributed_c10d.py"):
                waits_for = f"torch.distributed.{frame.f_code.co_name}"
        elif path.endswith(_LOADER):
            waits_for = waits_for or "torch's DataLoader (waiting for a batch)"
        elif waits_for is not None and where is None:
            where, inner = f"in {waits_for}, called at {_place(frame)}", frame
        if _PACKAGES not in path and path.startswith(_PROJECT + os.sep):
            break
        frame = frame.f_back
    where = where or f"at {_place(inner)}"
    return where if frame is None or frame is inner else f"{where}, from {_place(frame)}"


def _place(frame) -> str:
    path = frame.f_code.co_filename
    if _PACKAGES in path:
        path = path.split(_PACKAGES, 1)[1]
    else:
        for root in (_PROJECT, _STDLIB):
            if path.startswith(root + os.sep):
                path = os.path.relpath(path, root)
                break
    return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"


_ACTIVE: list[Watchdog] = []  # the one watchdog of this process, while a run is under way


@contextlib.contextmanager
def running(args, rank: int, world_size: int):
    """Watch this process's run (nothing when hang_timeout_minutes is 0 or null)."""
    dog = Watchdog.from_args(args, rank, world_size)
    if dog is None:
        yield None
        return
    dog.start()
    _ACTIVE.append(dog)
    try:
        yield dog
    except BaseException as err:
        waited = collective_timeout(err)
        if waited is not None:
            with contextlib.suppress(Exception):  # the report must not replace the error
                dog.report_collective_timeout(err, waited)
        raise
    finally:
        _ACTIVE.remove(dog)
        dog.stop()


def phase(name: str, iteration: int | None = None):
    """The running watchdog's `phase` context; does nothing when none runs."""
    return _ACTIVE[-1].phase(name, iteration) if _ACTIVE else contextlib.nullcontext()
