"""What every entry script shares: reading its command line, and turning user errors into one line.

Errors a user can fix (bad config, missing file, unreachable master, ...) print `error: <what to
do>` (on a worker `error (rank R on HOST): ...`) and exit non-zero without a traceback; set
NEOX_TRACEBACK=1 to see the traceback as well. Anything else is a bug and keeps its traceback.
A worker first takes the variables of the file NEOX_ENV_FILE names (export_env_vars sent by a
multi-node launch, megatron.launching.secrets).
"""

from __future__ import annotations

import os
import re
import socket
import sys
import traceback
from typing import Callable

from megatron.launching.local import name_cpu_accelerator
from megatron.launching.secrets import load_env_file
from megatron.launching.stopping import LAUNCH_ID_VAR
from megatron.monitoring.errors import describe_error
from megatron.monitoring.logger import setup_logging
from megatron.safety.signals import Preempted

# ImportError: an optional package a chosen feature needs is missing (its message says which)
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
               RuntimeError, PermissionError, ImportError)


CONFIG_SUFFIXES = (".yml", ".yaml", ".json")
# GPT-NeoX deepy.py's short options -> the config key they set
SHORT_OPTIONS = {"-H": "hostfile", "-i": "sample_input_file", "-o": "sample_output_file"}


def split_command_line(argv: list[str]) -> tuple[list[str], list[str]]:
    """(config files, `key=value` overrides).

    GPT-NeoX's forms work too: `--key value`, `--key=value`, and `--key v1 v2 ...` (a list,
    e.g. `--eval_tasks lambada_openai hellaswag`); values run until the next `--option`,
    `key=value` or config file. As in GPT-NeoX's deepy.py, `-d/--conf_dir DIR` is put in front
    of every config file, a file named without a suffix gets `.yml` (`125M` is `125M.yml`),
    and `-H`, `-i`, `-o` set hostfile, sample_input_file and sample_output_file.
    """
    files, overrides, conf_dir = [], [], None
    i = 0
    while i < len(argv):
        item = argv[i]
        if item in ("-d", "--conf_dir") or item.startswith("--conf_dir="):
            conf_dir, i = _option_value(argv, i, "conf_dir")
            continue
        if item in SHORT_OPTIONS:
            value, i = _option_value(argv, i, SHORT_OPTIONS[item])
            overrides.append(f"{SHORT_OPTIONS[item]}={value}")
            continue
        if item == "--autotuning" or item.startswith("--autotuning="):
            raise ValueError("--autotuning (DeepSpeed's autotuner) is not supported here; remove "
                             "it and set the batch sizes and ZeRO stage in the config")
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
        if _is_override(item):
            overrides.append(item)
        elif item.startswith("=") and i:  # `train_iters = 3`, `train_iters =3`
            after = argv[i + 1] if item == "=" and i + 1 < len(argv) else item[1:]
            raise ValueError(f"spaces around '=' on the command line: write the override as one "
                             f"word, {argv[i - 1]}={after}")
        elif item.endswith(".py"):
            raise ValueError(f"{item} is a script among the config files: the script comes first, "
                             f"python deepy.py {item} configs/a.yml [key=value ...]")
        else:
            files.append(item)
        i += 1
    return [_config_path(f, conf_dir) for f in files], overrides


def _option_value(argv: list[str], i: int, key: str) -> tuple[str, int]:
    """(the value of the option at argv[i], the index after it): `-x V`, `--x V` or `--x=V`."""
    if "=" in argv[i]:
        return argv[i].split("=", 1)[1], i + 1
    if i + 1 >= len(argv):
        raise ValueError(f"command-line option {argv[i]} has no value; write {key}=VALUE")
    return argv[i + 1], i + 2


def _config_path(name: str, conf_dir: str | None) -> str:
    """GPT-NeoX's rule: the conf_dir in front, `.yml` added to a name without a suffix."""
    path = os.path.join(conf_dir, name) if conf_dir else name
    return path if path.endswith(CONFIG_SUFFIXES) else path + ".yml"


def _is_override(item: str) -> bool:
    """`key=value` (the key a name such as `vocab_file` or `optimizer.params.lr`); a path that
    happens to hold '=' is a config file only when it ends like one and has no key before it."""
    return re.match(r"^[A-Za-z_][\w.\-]*=", item) is not None


def _is_option_or_file(item: str) -> bool:
    return (item.startswith("--") or item in SHORT_OPTIONS or item == "-d"
            or item.endswith(CONFIG_SUFFIXES) or _is_override(item))


def exit_process(status: int):
    """End a finished entry script with `status` the way the interpreter would — non-daemon
    threads joined, then the atexit handlers (logging, multiprocessing's children, trackers)
    — but without its final teardown of every module and object, which takes most of a second
    with torch and DeepSpeed loaded and does nothing a finished process needs. For the
    `if __name__ == "__main__"` of scripts only: it never returns."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        # the interpreter's own first step at exit: threading's exit hooks, which tell a
        # ThreadPoolExecutor's idle workers (torch.compile keeps some) to stop, then the join.
        # Joining those workers without the hooks waits for ever.
        shutdown()
    else:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe has nobody left to read it
    os._exit(0 if status is None else status if isinstance(status, int) else 1)


class _PipeProof:
    """A worker's stdout or stderr, read by deepy.py through a pipe: should deepy.py be gone (its
    end of the pipe closed), writes are dropped instead of failing the step that would save."""

    def __init__(self, stream):
        self._stream, self._gone = stream, False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except (BrokenPipeError, ValueError):
                self._gone = True
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except (BrokenPipeError, ValueError):
                self._gone = True

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run_entry(main: Callable[[], int | None]) -> int:
    """Run `main`, mapping user errors to a one-line message and exit status 1 (3 for a stop
    by the loss guard, 128 + the signal for a stop on SIGTERM / SIGINT)."""
    if LAUNCH_ID_VAR in os.environ and not isinstance(sys.stdout, _PipeProof):  # a worker
        sys.stdout, sys.stderr = _PipeProof(sys.stdout), _PipeProof(sys.stderr)
    setup_logging()
    try:
        load_env_file(os.environ)
        name_cpu_accelerator(os.environ)
        return int(main() or 0)
    except Preempted as stop:
        if os.environ.get("RANK", "0") == "0":
            print(str(stop), file=sys.stderr, flush=True)
        return stop.exit_status
    except USER_ERRORS as err:
        if os.environ.get("NEOX_TRACEBACK") == "1":
            # the whole traceback, then the same exit as without it: an exception left to the
            # interpreter ends a worker through its teardown, where a live process group can
            # abort the process (SIGABRT, status 134) instead of exit 1
            traceback.print_exc()
            sys.stderr.flush()
            return getattr(err, "exit_status", 1)
        rank = os.environ.get("RANK")
        prefix = (f"error (rank {rank} on {socket.gethostname()}): " if rank is not None
                  else "error: ")
        print(prefix + describe_error(err), file=sys.stderr, flush=True)
        return getattr(err, "exit_status", 1)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
