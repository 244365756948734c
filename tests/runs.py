"""Helpers for tests that run the real launcher: a small real dataset, free ports, deepy runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# verbatim copies of GPT-NeoX's own config files (see the README there)
NEOX_CONFIGS = ROOT / "tests" / "neox_arguments" / "data" / "gpt-neox"


def free_port() -> int:
    """A free port outside the kernel's ephemeral range, as deepy.py picks one (a launcher
    started later can never be handed it)."""
    from megatron.launcher import free_port as pick

    return pick()


def build_small_dataset(out_dir: Path, vocab_size: int = 2048) -> tuple[str, str]:
    """The built-in corpus with a small BPE tokenizer: (data prefix, tokenizer path)."""
    from megatron.data.prepare import prepare_builtin

    prepared = prepare_builtin(str(out_dir), vocab_size=vocab_size)
    return prepared.data_prefix, prepared.vocab_file


def tiny_overrides(data_prefix: str, tokenizer: str, run_dir: Path, **extra) -> list[str]:
    """key=value overrides that point configs/tiny.yml at test data and a run directory."""
    values = {
        "data_path": data_prefix, "vocab_file": tokenizer,
        "save": str(run_dir / "ckpt"), "load": str(run_dir / "ckpt"),
        "log_dir": str(run_dir / "logs"), "seq_length": 64, "train_iters": 20,
        "eval_interval": 10, "eval_iters": 2, "log_interval": 5, "checkpoint_factor": 10,
        "master_port": free_port(), "distributed_timeout_minutes": 2,
    }
    values.update(extra)
    return [f"{k}={v}" for k, v in values.items()]


SHORT_RUN = dict(train_iters=4, log_interval=2, eval_interval=4, eval_iters=1, checkpoint_factor=4)
# what a launcher leaves in a worker's environment; launcher tests start from none of it
LAUNCHER_PREFIXES = ("OMPI_", "PMI", "PMIX_", "SLURM_", "MPI_LOCALRANKID", "MV2_")
LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra) -> dict:
    """This environment without any launcher's variables, one thread per process, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


def deepy(*argv: str, timeout: float = 300, env: dict | None = None,
          cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `python deepy.py ...` and capture its output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "deepy.py"), *argv], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def read_metrics(log_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training records, validation records) from metrics.jsonl."""
    records = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    return ([r for r in records if "lm_loss" in r], [r for r in records if "val_loss" in r])


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def worker_processes(launcher_pid: int, script: str = "train.py") -> list:
    """The worker processes (one per rank) running `script` under the launch started as
    `launcher_pid`: processes with the script and the config flag on their command line whose
    parent is not one (a worker's data-loader processes are), and not a launcher module."""
    import psutil

    found = {}
    for child in psutil.Process(launcher_pid).children(recursive=True):
        try:
            argv = child.cmdline()
            if script in " ".join(argv) and "--neox_args" in argv and \
                    not any(a.startswith("deepspeed.launcher") for a in argv):
                found[child.pid] = child
        except psutil.NoSuchProcess:
            continue
    workers = []
    for child in found.values():
        try:
            if child.ppid() not in found:
                workers.append(child)
        except psutil.NoSuchProcess:
            continue
    return workers


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, limit: float = 300) -> None:
    """Wait until `text` appears in the file `proc` writes its output to (it must keep running)."""
    import time

    deadline = time.time() + limit
    while text not in path.read_text():
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.time() < deadline, path.read_text()[-3000:]
        time.sleep(0.2)
