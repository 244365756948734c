"""What every entry script shares: reading its command line, and turning user errors into one line.

Errors a user can fix (bad config, missing file, unreachable master, ...) print `error: <what to
do>` and exit non-zero without a traceback; set NEOX_TRACEBACK=1 to see the traceback as well.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from megatron.monitoring.logger import setup_logging

USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError, PermissionError)


def split_command_line(argv: list[str]) -> tuple[list[str], list[str]]:
    """(config files, `key=value` overrides).

    GPT-NeoX's forms work too: `--key value`, `--key=value`, and `--key v1 v2 ...` (a list,
    e.g. `--eval_tasks lambada_openai hellaswag`); values run until the next `--option`,
    `key=value` or config file.
    """
    files, overrides = [], []
    i = 0
    while i < len(argv):
        item = argv[i]
        if item.startswith("--"):
            key = item[2:]
            if "=" in key:
                overrides.append(key)
                i += 1
                continue
            values = []
            i += 1
            while i < len(argv) and not _is_option_or_file(argv[i]):
                values.append(argv[i])
                i += 1
            if not values:
                raise ValueError(f"command-line option {item} has no value; write {key}=VALUE")
            overrides.append(f"{key}={values[0]}" if len(values) == 1
                             else f"{key}=[{', '.join(values)}]")
            continue
        if "=" in item and not item.endswith((".yml", ".yaml")):
            overrides.append(item)
        else:
            files.append(item)
        i += 1
    return files, overrides


def _is_option_or_file(item: str) -> bool:
    return item.startswith("--") or item.endswith((".yml", ".yaml")) or "=" in item


def run_entry(main: Callable[[], int | None]) -> int:
    """Run `main`, mapping user errors to a one-line message and exit status 1."""
    setup_logging()
    try:
        return int(main() or 0)
    except USER_ERRORS as err:
        if os.environ.get("NEOX_TRACEBACK") == "1":
            raise
        rank = os.environ.get("RANK")
        prefix = f"error (rank {rank}): " if rank is not None else "error: "
        print(prefix + str(err), file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
