"""The one logger of the project: named loggers, rank-aware printing, and setup for entry scripts.

Library code calls `get_logger(__name__)` and logs; nothing is configured at import time. Entry
scripts call `setup_logging()` once. `print_rank_0` prints only on global rank 0 (or when not
distributed), so every rank can call it unconditionally.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import warnings

_ROOT = "megatron"
_FORMAT = "[%(asctime)s] [%(levelname)s] [%(name)s] %(message)s"


def get_logger(name: str) -> logging.Logger:
    """A logger under the project's root logger (`megatron.*`), whatever module asks for it."""
    if name != _ROOT and not name.startswith(_ROOT + "."):
        name = f"{_ROOT}.{name}"
    return logging.getLogger(name)


def global_rank() -> int:
    """This process's global rank from the launcher's environment (0 when not launched)."""
    return int(os.environ.get("RANK", "0"))


class _StderrHandler(logging.StreamHandler):
    """Writes each record to sys.stderr as it is then, not as it was at setup: a redirect
    (contextlib.redirect_stderr, a test's capture) is followed, and a stream closed since is
    never written to."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def setup_logging(level: int | str = logging.INFO, all_ranks: bool = False) -> None:
    """Send the project's log records to stderr; ranks other than 0 log warnings and up only.

    Safe to call more than once: the handler is installed a single time, and a later call sets
    the level again.
    """
    root = logging.getLogger(_ROOT)
    if isinstance(level, str):
        level = logging.getLevelName(level.upper())
    handler = _handler(root)
    if handler is None:
        handler = _StderrHandler()
        handler._megatron = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    handler._megatron_settings = (level, all_ranks)  # type: ignore[attr-defined]
    root.propagate = False
    refresh_rank()


def refresh_rank() -> None:
    """Apply the rank-dependent level and `[rank N]` prefix again, once RANK is known (a worker
    started by mpirun or srun learns it in `init_distributed`)."""
    root = logging.getLogger(_ROOT)
    handler = _handler(root)
    if handler is None:
        return
    level, all_ranks = handler._megatron_settings  # type: ignore[attr-defined]
    root.setLevel(level if (global_rank() == 0 or all_ranks) else max(logging.WARNING, level))
    handler.setFormatter(_formatter(None))
    # DeepSpeed's own logger (once deepspeed is imported) writes to stdout, where the launcher
    # does not merge the warnings every rank prints alike
    if logging.getLogger("DeepSpeed").handlers:
        _ADOPTED.setdefault("DeepSpeed", "deepspeed")
    for name in _ADOPTED:
        adopt_logger(name, _ADOPTED[name])


# third-party loggers that write in the project's form: logger name -> name shown
_ADOPTED: dict[str, str] = {}


def adopt_logger(name: str, shown: str) -> logging.Handler:
    """Have the third-party logger `name` write its lines in the project's form (`[rank N]
    [time] [LEVEL] [shown] ...`) to sys.stderr, where the launcher merges the warnings that
    every rank prints alike (megatron.launching.merge), in place of its own handlers; returns
    the handler. Its level is left as it is."""
    _ADOPTED[name] = shown
    logger = logging.getLogger(name)
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    logger.handlers[:] = [handler or _StderrHandler()]
    logger.propagate = False
    logger.handlers[0].setFormatter(_formatter(shown))
    return logger.handlers[0]


def _formatter(shown: str | None) -> logging.Formatter:
    """The project's line format, `[rank N] ` first in a launched process; `shown` in place of
    the logger's name."""
    prefix = f"[rank {global_rank()}] " if "RANK" in os.environ else ""
    form = _FORMAT if shown is None else _FORMAT.replace("%(name)s", shown)
    return logging.Formatter(prefix + form, datefmt="%H:%M:%S")


def _handler(root: logging.Logger) -> logging.Handler | None:
    return next((h for h in root.handlers if getattr(h, "_megatron", False)), None)


def print_rank_0(message: str) -> None:
    """Print a line to stdout on global rank 0 only (flushed, so launchers show it at once)."""
    if global_rank() == 0:
        print(message, flush=True)


@contextlib.contextmanager
def deepspeed_prints():
    """Pass what DeepSpeed print()s inside the block (its pipeline banners and layer listing,
    its every-`steps_per_print` loss line) to the debug log: shown with `log_level: debug`,
    hidden otherwise, so the console carries one line per event. DeepSpeed's logger, its
    warnings and errors are not affected."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        lines = [line for line in buffer.getvalue().splitlines() if line.strip()]
        if lines:
            get_logger("deepspeed").debug("%s", "\n".join(lines))


@contextlib.contextmanager
def deepspeed_warnings_hidden(patterns: tuple[str, ...]):
    """Drop the records of DeepSpeed's logger that match one of `patterns` (regular
    expressions) inside the block: warnings that do not apply to this run's config."""

    def keep(record: logging.LogRecord) -> bool:
        return not any(re.search(p, record.getMessage()) for p in patterns)

    ds = logging.getLogger("DeepSpeed")
    ds.addFilter(keep)
    try:
        yield
    finally:
        ds.removeFilter(keep)


# third-party warnings that say nothing to the user, once per rank: DeepSpeed 0.19's ZeRO 1/2
# gathers the updated weights with the torch call torch 2.13 deprecates
_FOREIGN_DEPRECATIONS = (r"`torch\.distributed\.all_gather_into_tensor` is deprecated",)


def hide_foreign_deprecations() -> None:
    """Ignore the deprecation warnings of the packages we call (`_FOREIGN_DEPRECATIONS`): the
    user can act on none of them. Our own code's warnings are unaffected."""
    for message in _FOREIGN_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def who(ranks: list[int]) -> str:
    """'rank 3', or 'ranks 0, 2-5, 9' for [0, 2, 3, 4, 5, 9]."""
    parts, ranks = [], sorted(ranks)
    start = prev = None
    for r in ranks + [None]:
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = r
    return f"rank {parts[0]}" if len(ranks) == 1 else f"ranks {', '.join(parts)}"
