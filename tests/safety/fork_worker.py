"""Forks a process many times while another thread reads the main thread's frame in a loop, as
the watchdog's heartbeat does while a DataLoader starts its workers; prints how many children
never got to run (deadlocked in the fork).

    python -m tests.safety.fork_worker FORKS [raw]

With `raw` the frames are read with sys._current_frames() itself, without the watchdog's guard,
and forking stops at the first stuck child: on Python 3.11 one comes within a few dozen forks. The reading thread makes garbage whose finalizers
release the GIL, and the collector runs at every allocation, so that frames are often read
while another thread runs: what makes the deadlock likely enough to be seen in a few seconds.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time

from megatron.safety.watchdog import thread_frame

CHILD_SECONDS = 2.0  # a child that has not exited by then is stuck


class _Finalized:
    def __del__(self):
        time.sleep(0.0005)  # lets other threads run, from inside the collector


def _read_frames(main: int, raw: bool) -> None:
    while True:
        for _ in range(20):
            cycle = _Finalized()
            cycle.self = cycle  # freed only by the collector
        sys._current_frames().get(main) if raw else thread_frame(main)


def _calls() -> None:
    def nested(depth: int) -> None:
        if depth:
            return nested(depth - 1)
        time.sleep(0.0001)
    while True:  # new frames all the time: reading them allocates
        nested(5)


def _fork_and_reap() -> bool:
    """One child that exits at once; False when it is still there after CHILD_SECONDS."""
    pid = (lambda: os.fork())()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + CHILD_SECONDS
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return False


def main(argv=None) -> int:
    argv = argv or sys.argv[1:]
    forks, raw = int(argv[0]), "raw" in argv[1:]
    gc.set_threshold(1)
    main_thread = threading.get_ident()
    threading.Thread(target=_read_frames, args=(main_thread, raw), daemon=True).start()
    threading.Thread(target=_calls, daemon=True).start()
    done = stuck = 0
    while done < forks and not (raw and stuck):
        stuck += not _fork_and_reap()
        done += 1
    print(f"stuck children: {stuck} of {done}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
