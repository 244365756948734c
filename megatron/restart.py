"""Automatic restart (`max_restarts`): a training job whose workers fail starts again from the
newest valid checkpoint in `save`, up to `max_restarts` times, each restart announced in one line.

A failure is any non-zero exit except the ones that asked for the stop: SIGTERM / SIGINT /
SIGUSR1 (128 + the signal; a scheduler or a user stopping the run) and a stop by the loss guard
(`TrainingStopped.exit_status`: the same batches would diverge again). A worker killed by a
signal, a crash, or a hang ended by the watchdog (124) is restarted. The restarted attempt loads
`save` (not `finetune`, not a fixed `iteration`): the loader takes the newest checkpoint there
that verifies, with its data position, so the run continues as if uninterrupted. Before the
first checkpoint exists, an attempt starts again as the first one did.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Callable

from megatron.monitoring.logger import get_logger
from megatron.safety import watchdog
from megatron.safety.guard import TrainingStopped

log = get_logger(__name__)

RESTARTABLE_SCRIPTS = ("train.py",)
KILLING_SIGNALS = {signal.SIGINT, signal.SIGABRT, signal.SIGBUS, signal.SIGKILL, signal.SIGSEGV,
                   signal.SIGTERM}
REQUESTED_STOPS = {128 + signal.SIGTERM: "stopped by SIGTERM", 128 + signal.SIGINT:
                   "interrupted (SIGINT)", 128 + signal.SIGUSR1: "stopped by SIGUSR1",
                   TrainingStopped.exit_status: "stopped by the loss guard"}


def describe_status(status: int) -> str:
    """An exit status in words: `exit status 1`, `killed by SIGKILL`, `exit status 143
    (SIGTERM)`; 256 - N is how a launcher's exit(-N) for a worker killed by signal N reads."""
    if status < 0:
        return f"killed by {_signal_name(-status)}"
    if status == watchdog.EXIT_CODE:
        return f"exit status {status} (a hang, ended by the watchdog)"
    if 0 < status - 128 < 65 and _signal_name(status - 128) != str(status - 128):
        return f"exit status {status} (128 + {_signal_name(status - 128)})"
    if 256 - status in KILLING_SIGNALS:
        return f"exit status {status} (a worker killed by {_signal_name(256 - status)})"
    return f"exit status {status}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def restart_point(args) -> tuple[object, str]:
    """(the config of the next attempt, where it starts, in words)."""
    from megatron.checkpointing.locate import newest_good_iteration

    save = Path(args.checkpoint.save)
    newest = newest_good_iteration(save) if save.is_dir() else None
    if newest is None:
        return args, f"no checkpoint in {save} yet: starting again as the first attempt did"
    wanted = {"load": str(save), "finetune": False, "iteration": None}
    changed = {key: value for key, value in wanted.items() if getattr(args, key) != value}
    resumed = args.replace(**changed) if changed else args
    return resumed, f"resuming from the newest valid checkpoint in {save} (iteration {newest})"


def run_with_restarts(args, script: str, attempt: Callable[[object], int]) -> int:
    """Run `attempt(args)` (one launch of every worker; its exit status), and again after a
    failure as the module docstring says. The last attempt's status is returned."""
    limit = args.launcher.max_restarts
    if limit and Path(script).name not in RESTARTABLE_SCRIPTS:
        log.info("max_restarts applies to training runs; %s runs once", Path(script).name)
        limit = 0
    status = attempt(args)
    for restart in range(1, limit + 1):
        if status == 0:
            break
        if status in REQUESTED_STOPS:
            log.info("not restarting: the run was %s", REQUESTED_STOPS[status])
            break
        args, where = restart_point(args)
        log.warning("restart %d of %d: the workers failed (%s); %s", restart, limit,
                    describe_status(status), where)
        status = attempt(args)
    else:
        if limit and status not in (0, *REQUESTED_STOPS):
            log.error("the workers failed (%s) and all %d restart(s) (max_restarts) are used",
                      describe_status(status), limit)
    return status
