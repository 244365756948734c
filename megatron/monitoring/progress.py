"""Progress bars for work a user waits on that prints no line per step (tqdm, on stderr).

    for doc in progress(documents, total=n, desc="tokenizing", unit="doc"): ...
    with progress(total=3, desc="indices") as bar: ...; bar.update()

Shown on global rank 0 only, and only when stderr is a terminal, so CI logs and redirected
output stay clean. The environment variable NEOX_PROGRESS forces them: `1` (or true/on/yes)
shows them wherever stderr goes, `0` (or false/off/no) hides them everywhere.
"""

from __future__ import annotations

import os
import sys

from megatron.monitoring.logger import global_rank

ENV = "NEOX_PROGRESS"
_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")


def progress_enabled() -> bool:
    """Whether this process draws bars: rank 0, and NEOX_PROGRESS or else a terminal stderr."""
    if global_rank() != 0:
        return False
    value = os.environ.get(ENV, "").strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    if value:
        raise ValueError(f"{ENV}={os.environ[ENV]!r} is not understood: set it to 1 to force "
                         f"progress bars on or 0 to turn them off (unset: on when stderr is a "
                         f"terminal)")
    return sys.stderr.isatty()


def progress(iterable=None, total: int | None = None, desc: str | None = None,
             unit: str = "it"):
    """A tqdm bar over `iterable` (or a manual one with `total`), drawn only when enabled."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr,
                disable=not progress_enabled(), dynamic_ncols=True, mininterval=0.5)
