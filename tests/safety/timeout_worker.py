"""A stand-in for one training rank whose collective times out, for the watchdog's report.

    python -m tests.safety.timeout_worker RANK WORLD_SIZE LOG_DIR PORT TIMEOUT_SECONDS

Both ranks join a gloo group (collective timeout TIMEOUT_SECONDS) and run one train step with an
all-reduce under the hang watchdog (limit 30 s: heartbeats every second). In the eval step of
iteration 2, rank 0 all-reduces again while every other rank waits outside any collective, as a
rank whose data loader stalled would: rank 0's all-reduce times out. The script ends as
train.py does (megatron.entry.run_entry): the error in one line, exit status 1.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megatron.entry import run_entry
from megatron.safety import watchdog


def stuck_in_loader() -> None:
    threading.Event().wait()  # forever


def main() -> int:
    rank, world, log_dir, port, timeout = sys.argv[1:6]
    os.environ["RANK"] = rank  # run_entry names the rank in its error line
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank),
                            world_size=int(world), timeout=timedelta(seconds=float(timeout)))
    args = SimpleNamespace(
        training=SimpleNamespace(hang_timeout_minutes=0.5, hang_step_factor=0,
                                 hang_timeout_checkpoint_minutes=0),
        logging=SimpleNamespace(log_dir=log_dir))
    with watchdog.running(args, int(rank), int(world)):
        with watchdog.phase("train step", 1):
            dist.all_reduce(torch.ones(1))
        with watchdog.phase("eval step", 2):
            if int(rank) == 0:
                dist.all_reduce(torch.ones(1))
            else:
                stuck_in_loader()
    return 0


if __name__ == "__main__":
    sys.exit(run_entry(main))
