"""The workers' output as deepy.py prints it: a warning that several ranks print alike is printed
once, naming the ranks; everything else passes through as it comes.

    merger = WarningMerger(sys.stderr, ranks=range(8))
    merger.feed(rank, "[rank 3] [12:00:01] [WARNING] [megatron.data.loaders] num_workers=2 ...")
    ...
    merger.close()                        # prints what is still held

    [ranks 0-7] [12:00:01] [WARNING] [megatron.data.loaders] num_workers=2 exceeds the 1 ...

A warning line (this project's `[WARNING]` / `[ERROR]` log lines, DeepSpeed's, any line with
`Warning:`) is held up to `window` seconds, or until every rank has printed it, and then printed
once with the ranks that printed it; its text without the rank and the time stamps is what makes
two lines alike. A line from one rank only keeps its own `[rank R]`. A rank's later lines wait
behind its held warning, so each rank's lines keep their order (its stdout lines too, through
`feed_plain`); other ranks' lines pass at once.
Lines may come behind a launcher's `host: ` prefix (pdsh) and may name several ranks already
(`[ranks 0-3]`, a node launcher's merge); the merged line names every rank, without the host.

A worker's last words, the error that ended it (`error (rank 3 on node-b): ...`, megatron.entry,
and the further lines of a message of several), are merged the same way, naming the hosts, and
held for the window or until a death report (`... died: ...`), which prints whatever is held
first, so that the error comes before it; `said_why(ranks)` tells a launcher that those ranks
printed such an error, so their death needs no line of its own. Ranks whose further lines
differ get a copy each; a copy whose lines begin another's (cut short, or, in mpirun's stream
that mixes ranks, its last lines taken by the next copy) joins that one:

    error (ranks 0-7 on node-a, node-b): checkpoint ck/global_step2 is damaged and will not ...
      - ck/global_step2/layer_00-model_00-model_states.pt: sha256 90ccf575c0d3c7c8... differs ...
    Restore the files from a backup or pick another checkpoint (iteration=<N>, or ...)

The lines of a C++ backtrace that torch's distributed code appends to some of its own error
and warning lines ("Exception raised from ... (most recent call first):", "frame #N: ...",
"<omitting python frames>") are left out: the line they follow says what happened. With
TORCH_SHOW_CPP_STACKTRACES=1 in deepy.py's environment they are printed.

`pipe_lines` copies a worker's pipe to its stream: whole lines through the merger, and a
carriage-return update (a progress bar redrawing itself) straight through.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import os
import re
import threading
import time
from typing import Iterable, TextIO

from megatron.monitoring.logger import who

# long enough for ranks that reach the same point seconds apart (pipeline stages building their
# layers, 4 or 8 workers sharing a few cores) to be merged; a line held this long is at most as
# late, and a worker's death prints what is held first
WINDOW_SECONDS = 3.0
HOST_PREFIX = re.compile(r"^(?P<host>[\w.\-]+): (?=\[|error \(ranks? )")
RANKS_PREFIX = re.compile(r"^\[ranks? (?P<ranks>[\d, \-]+)\] ")
STAMPS = re.compile(r"^(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:,\d+)?\] |\[\d\d:\d\d:\d\d\] )")
# the line a worker ends on after a user error (megatron.entry.run_entry)
WORKER_ERROR = re.compile(r"^error \(ranks? (?P<ranks>[\d, \-]+) on (?P<hosts>[^)]*)\): ")
# a launcher's line for a dead worker (megatron.launching.local.death_line, runner.py's)
DEATH = re.compile(r"\bdied: ")
WARNING = re.compile(r"\[(?:WARNING|ERROR)\]|\bWarning: ")
CPP_BACKTRACE = re.compile(r"^(?:[\w.\-]+: )?(?:frame #\d+: |<omitting python frames>$|"
                           r"Exception raised from .* \(most recent call first\):$)")


def parse_ranks(text: str) -> set[int]:
    """{0, 2, 3, 4} for '0, 2-4' (the inverse of logger.who)."""
    ranks: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        ranks.update(range(int(first), int(last or first) + 1))
    return ranks


def split_line(line: str) -> tuple[set[int] | None, str, str]:
    """(the ranks the line names, its time stamp, the rest): '[rank 3] [12:00:01] [WARNING] x'
    -> ({3}, '[12:00:01] ', '[WARNING] x'); a host prefix is dropped."""
    host = HOST_PREFIX.match(line)
    if host:
        line = line[host.end():]
    ranks = None
    m = RANKS_PREFIX.match(line)
    if m:
        ranks, line = parse_ranks(m["ranks"]), line[m.end():]
    stamp = STAMPS.match(line)
    return ranks, (stamp.group(0) if stamp else ""), line[stamp.end():] if stamp else line


@dataclasses.dataclass(eq=False)
class _Held:
    """A warning held to be merged: the ranks that printed it, the first copy's stamp and line,
    and when it is printed at the latest. A worker's error keeps each copy's ranks, hosts and
    the lines that followed its first (a message of several lines)."""
    ranks: set[int]
    stamp: str
    first: str
    deadline: float
    copies: list[tuple[set[int], set[str], list[str]]] | None = None
    printed: bool = False


class WarningMerger:
    """Holds warning lines briefly to print each once with the ranks that printed it."""

    def __init__(self, out: TextIO, ranks: Iterable[int], window: float = WINDOW_SECONDS,
                 cpp_backtraces: bool | None = None):
        self.out, self.expected, self.window = out, set(ranks), window
        self.cpp_backtraces = (os.environ.get("TORCH_SHOW_CPP_STACKTRACES") == "1"
                               if cpp_backtraces is None else cpp_backtraces)
        self._held: dict[str, _Held] = {}  # text -> the warning held
        # rank -> its held warnings and the lines it printed after them, in its order
        self._behind: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        # a rank (or a node launcher's host, or None for a mixed stream) -> the worker error
        # whose further lines it is sending, and the list they go to
        self._open: dict[int | str | None, tuple[_Held, list[str]]] = {}
        self._explained: set[int] = set()  # ranks that printed the error they ended on
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._flush_loop, name="warning-merger",
                                       daemon=True)
        self._timer.start()

    def feed(self, rank: int | None, line: str) -> None:
        """One line from the worker of global rank `rank` (None: a launcher's mixed stream)."""
        ranks, stamp, text = split_line(line)
        if not self.cpp_backtraces and CPP_BACKTRACE.match(text):
            return
        if self._continues_error(rank, line):
            return
        hosts = set()
        error = WORKER_ERROR.match(text)
        if error:
            ranks = parse_ranks(error["ranks"])
            hosts = {h.strip() for h in error["hosts"].split(",")}
            text = "error: " + text[error.end():]
        ranks = ranks or ({rank} if rank is not None else None)
        if not ranks or not (error or WARNING.search(text)):
            if DEATH.search(text):  # a death report (a node launcher's): the errors held first
                self.flush()
            self._pass(ranks or (), line, self.out)
            return
        with self._lock:
            held = self._held.get(text)
            if held is None:
                held = self._held[text] = _Held(set(ranks), stamp, line,
                                                time.monotonic() + self.window,
                                                [] if error else None)
            else:
                held.ranks |= ranks
            if error:
                self._explained |= ranks
                copy = (set(ranks), hosts, [])
                held.copies.append(copy)
                host = HOST_PREFIX.match(line)
                self._open[rank if rank is not None else host and host["host"]] = held, copy[2]
            for r in ranks:
                if held not in self._behind[r]:
                    self._behind[r].append(held)
            self._release(time.monotonic())

    def said_why(self, ranks: Iterable[int]) -> bool:
        """Whether each of `ranks` printed a worker's error line (megatron.entry.run_entry's
        `error (rank R on HOST): ...`, which a worker prints just before it exits)."""
        with self._lock:
            return set(ranks) <= self._explained

    def feed_plain(self, rank: int, line: str, out: TextIO) -> None:
        """A line of the worker's other stream (stdout: the training log's rows), printed to
        `out` as it is, but behind a warning of its rank that is held, so that the rank's lines
        of both streams keep their order."""
        self._pass((rank,), line, out)

    def _pass(self, ranks, line: str, out: TextIO) -> None:
        with self._lock:
            waiting = [self._behind[r] for r in ranks if self._behind.get(r)]
            if waiting:  # behind a warning of its rank's that is held
                waiting[0].append((line, out))
            else:
                self._write(line, out)

    def _continues_error(self, rank: int | None, line: str) -> bool:
        """Whether `line` is a further line of a worker's error its source is sending (a line
        that starts no record of its own); it is kept with that error, or printed at once when
        the error already was."""
        with self._lock:
            source = rank
            if rank is None:
                host = re.match(r"^([\w.\-]+): ", line)
                if host and host[1] in self._open:  # pdsh's prefix
                    source, line = host[1], line[host.end():]
            if source not in self._open:
                return False
            if (RANKS_PREFIX.match(line) or STAMPS.match(line) or WORKER_ERROR.match(line)
                    or WARNING.search(line) or DEATH.search(line)):
                del self._open[source]
                return False
            held, body = self._open[source]
            if held.printed:
                self._write(line)
            else:
                body.append(line)
            return True

    def flush(self) -> None:
        """Print every line held now, with the ranks seen so far (before a worker's death is
        reported, so that its last words come first)."""
        with self._lock:
            for text in list(self._held):
                self._print(text)

    def close(self) -> None:
        self._stop.set()
        self._timer.join()
        self.flush()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.window / 4):
            with self._lock:
                self._release(time.monotonic())

    def _release(self, now: float) -> None:
        """Print each held warning that every rank has printed and that is the next line of each
        of its ranks, or whose window has passed (the lock held). A worker's error waits for its
        window, or for a death report: its further lines come after its first."""
        released = True
        while released:
            released = False
            for text, held in list(self._held.items()):
                if held.deadline <= now or (held.copies is None and held.ranks >= self.expected
                                            and all(self._behind[r][0] is held
                                                    for r in held.ranks)):
                    self._print(text)
                    released = True

    def _print(self, text: str) -> None:
        """Print the held warning `text`, then what its ranks printed behind it (the lock held)."""
        held = self._held.pop(text)
        if held.copies and len(held.copies) > 1:
            # "error (ranks 0-3 on a, b): ...", once for each text its further lines give it
            alike: dict[tuple[str, ...], tuple[set[int], set[str]]] = {}
            for ranks, hosts, body in held.copies:
                group = alike.setdefault(_deduplicated(body), (set(), set()))
                group[0].update(ranks)
                group[1].update(hosts)
            for body, (ranks, hosts) in _fold_prefixes(alike).items():
                self._write(f"error ({who(sorted(ranks))} on {', '.join(sorted(hosts))}): "
                            f"{text[len('error: '):]}")
                for line in body:
                    self._write(line)
        elif held.copies:
            for line in (held.first, *held.copies[0][2]):
                self._write(line)
        elif len(held.ranks) == 1:
            self._write(held.first)
        else:
            self._write(f"[{who(sorted(held.ranks))}] {held.stamp}{text}")
        held.printed = True
        for r in held.ranks:
            queue = self._behind[r]
            while queue and (isinstance(queue[0], tuple) or queue[0].printed):
                item = queue.popleft()
                if isinstance(item, tuple):
                    self._write(*item)

    def _write(self, line: str, out: TextIO | None = None) -> None:
        out = out or self.out
        out.write(line + "\n")
        out.flush()


def _deduplicated(body: list[str]) -> tuple[str, ...]:
    """An error's further lines with a line repeated at once kept once. In a stream that mixes
    ranks (mpirun's) the copies' further lines cannot be told apart: when a second rank's error
    starts before the first's last line came, the lines after it, both ranks' last ones, all go
    to the second copy, one after the other."""
    return tuple(line for i, line in enumerate(body) if i == 0 or line != body[i - 1])


def _fold_prefixes(alike: dict[tuple[str, ...], tuple[set[int], set[str]]]
                   ) -> dict[tuple[str, ...], tuple[set[int], set[str]]]:
    """The copies' further lines with each that begins a longer one counted into that one: the
    copy cut short, whose last lines went to another copy (above) or were not sent before the
    worker was stopped, printed once with the whole message."""
    folded: dict[tuple[str, ...], tuple[set[int], set[str]]] = {}
    for body in sorted(alike, key=len, reverse=True):
        ranks, hosts = alike[body]
        longer = next((b for b in folded if b[:len(body)] == body), None)
        if longer is None:
            folded[body] = (set(ranks), set(hosts))
        else:
            folded[longer][0].update(ranks)
            folded[longer][1].update(hosts)
    return folded


def pipe_lines(fd: int, out: TextIO, merger: WarningMerger | None, rank: int | None,
               plain: bool = False) -> None:
    """Copy the pipe `fd` to `out` until it closes: lines through `merger` (`plain`: only kept
    in order behind the rank's held warnings, never merged), carriage-return updates as they
    are. Closes `fd`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending, redrawing = "", False
    try:
        while True:
            chunk = os.read(fd, 65536)
            pending += decoder.decode(chunk, final=not chunk)
            if not chunk:
                break
            for piece, end in _pieces(pending):
                if end == "\r" or redrawing:  # a progress bar redrawing its line
                    _put(out, piece + end)
                    redrawing = end == "\r"
                elif merger is not None and plain:
                    merger.feed_plain(rank, piece, out)
                elif merger is not None:
                    merger.feed(rank, piece)
                else:
                    _put(out, piece + "\n")
            pending = pending[max(pending.rfind("\n"), pending.rfind("\r")) + 1:]
            if redrawing and pending:  # the bar as it is now, not at its next redraw
                _put(out, pending)
                pending = ""
    finally:
        if pending:
            _put(out, pending)
        os.close(fd)


def _pieces(text: str):
    """(piece, "\n" or "\r") for each terminated piece of `text`."""
    start = 0
    for m in re.finditer(r"[\r\n]", text):
        yield text[start:m.start()], m.group(0)
        start = m.end()


def _put(out: TextIO, text: str) -> None:
    out.write(text)
    out.flush()
