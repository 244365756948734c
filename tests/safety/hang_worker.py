"""A stand-in for one training rank that hangs at its third step, for the watchdog's tests.

    python -m tests.safety.hang_worker RANK WORLD_SIZE LOG_DIR LIMIT_SECONDS

Runs two quick train steps under the hang watchdog (step limit LIMIT_SECONDS, no step factor),
then blocks in the third as a rank waiting for a stopped peer would.
"""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

from megatron.safety import watchdog


def wait_for_peer() -> None:
    threading.Event().wait()  # forever


def main(argv=None) -> int:
    rank, world, log_dir, limit = (argv or sys.argv[1:])[:4]
    args = SimpleNamespace(
        training=SimpleNamespace(hang_timeout_minutes=float(limit) / 60, hang_step_factor=0,
                                 hang_timeout_checkpoint_minutes=0),
        logging=SimpleNamespace(log_dir=log_dir))
    with watchdog.running(args, int(rank), int(world)):
        for iteration in (1, 2):
            with watchdog.phase("train step", iteration):
                pass
        with watchdog.phase("train step", 3):
            wait_for_peer()
    return 0


if __name__ == "__main__":
    sys.exit(main())
