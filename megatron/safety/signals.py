"""Stopping on a signal: SIGTERM (a preemption: Kubernetes, SLURM, `kill`), SIGINT (Ctrl-C) or
SIGUSR1 (SLURM's `--signal=USR1@SECONDS` warning before the time limit, and how deepy.py passes
a stop through mpirun, which forwards SIGUSR1 to its processes but ends them at once on SIGTERM)
asks the run to stop; it finishes the step, saves, and exits with the signal's status.

    with StopSignals() as stops:
        ...one training step...
        signum = stops.agreed()      # collective: 0, or the signal every rank now acts on
        if signum: save, then raise Preempted(signum, iteration, checkpoint)

A signal reaches some ranks and not others (DeepSpeed's launcher passes it on one worker at a
time), so each step ends with one all-reduce of the signal received: all ranks stop after the
same step. A second SIGINT stops at once (KeyboardInterrupt), for a run that must not wait.
`entry.run_entry` prints a `Preempted` as one line and exits with 128 + the signal number
(143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1), the status a shell gives a process that
signal ended.
"""

from __future__ import annotations

import signal

from megatron.monitoring.logger import get_logger

log = get_logger(__name__)

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
STOP_STATUSES = tuple(128 + s for s in HANDLED)  # a worker's orderly stop after saving


class Preempted(Exception):
    """The run stopped on a signal after saving what it could."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """Notes SIGTERM / SIGINT while installed (the main thread's handlers); `plan` is what the
    warning on the first one says the process will do."""

    def __init__(self, plan: str = "stopping after this step, with a checkpoint"):
        self.received = 0
        self.plan = plan
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        for signum in HANDLED:
            self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _note(self, signum: int, frame) -> None:
        if self.received == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if not self.received:
            self.received = signum
            log.warning("received %s: %s%s", signal.Signals(signum).name, self.plan,
                        " (a second Ctrl-C stops at once)" if signum == signal.SIGINT else "")

    def agreed(self) -> int:
        """The signal any rank received (0: none), the same on every rank. Collective."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([float(self.received)])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())
