"""Helpers for tests that run the real launcher: a small real dataset, free ports, deepy runs,
and the same launches with the workers forked in-process (`launch_in_process`) for tests whose
subject is what the workers do."""

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


def _launched_worker(rank: int, world: int, script: str, worker_argv: list[str],
                     output: str) -> int:
    """One worker of `launch_in_process`: the script's main() with the launcher's argv, its
    stdout and stderr (and those of what it starts) in files of `output`."""
    import importlib.util

    import torch

    for fd, suffix in ((1, "out"), (2, "err")):
        file = os.open(Path(output) / f"{rank}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # as the launcher's variable would
    spec = importlib.util.spec_from_file_location(f"_launched_{Path(script).stem}",
                                                  ROOT / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return module.main(worker_argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def launch_in_process(script: str, *argv: str) -> subprocess.CompletedProcess:
    """What `python deepy.py <script> *argv` does on this machine (config resolved, launch
    planned, preflight, each worker's environment), with the workers forked from the test
    session's fork server (tests/distributed.py), which has torch and DeepSpeed imported,
    instead of started as new Python processes: on 2 cores the workers of an 8-process launch
    spend some 20 s importing them. For tests whose subject is what the workers compute and
    print, not the launch: the result has the workers' exit status as deepy.py would give it
    (the first that is not 0) and their stdout and stderr, rank after rank, without deepy.py's
    own lines or its merging of warnings; a launch deepy.py refuses has its status (1) and
    error line. Nothing watches the workers: a test
    that kills one or expects one to fail alone runs deepy.py."""
    import contextlib
    import io
    import tempfile

    from megatron.entry import USER_ERRORS, split_command_line
    from megatron.launcher import plan_launch
    from megatron.launching.local import name_cpu_accelerator, worker_env
    from megatron.launching.stopping import LAUNCH_ID_VAR, new_launch_id
    from megatron.neox_arguments import NeoXArgs
    from megatron.monitoring.errors import describe_error
    from megatron.monitoring.logger import setup_logging
    from megatron.preflight import preflight
    from tests.distributed import run_distributed

    launcher_out, launcher_err = io.StringIO(), io.StringIO()  # what deepy.py would print
    setup_logging()  # its handler writes to the sys.stderr of the moment: launcher_err below
    try:
        with contextlib.redirect_stdout(launcher_out), contextlib.redirect_stderr(launcher_err):
            files, overrides = split_command_line(list(argv))
            args = NeoXArgs.from_ymls(files, overrides)
            setup_logging(args.logging.log_level)
            plan = plan_launch(args, script)
            assert plan.local is not None and plan.local.nnodes == 1, "one node's launches only"
            preflight(args.with_world_size(plan.world_size), script,
                      workers_here=len(plan.local.ranks))
    except USER_ERRORS as err:  # as deepy.py reports it
        return subprocess.CompletedProcess([script, *argv], 1, launcher_out.getvalue(),
                                           f"{launcher_err.getvalue()}error: "
                                           f"{describe_error(err)}\n")
    launch_id = new_launch_id()
    env = {**clean_env(), **plan.env, LAUNCH_ID_VAR: launch_id}
    name_cpu_accelerator(env)
    environs = [worker_env(env, plan.local, r, launch_id) for r in range(len(plan.local.ranks))]
    worker_argv = plan.argv[plan.argv.index(script) + 1:]
    with tempfile.TemporaryDirectory(prefix="workers_") as output:
        try:
            statuses = run_distributed(_launched_worker, plan.world_size, script, worker_argv,
                                       output, join=False, environs=environs)
        finally:
            texts = {suffix: "".join((Path(output) / f"{r}.{suffix}").read_text()
                                     for r in range(plan.world_size)
                                     if (Path(output) / f"{r}.{suffix}").exists())
                     for suffix in ("out", "err")}
            print(texts["out"], end="")  # in the test's capture, shown when it fails
            print(texts["err"], end="", file=sys.stderr)
    status = next((s for s in statuses if s != 0), 0)
    return subprocess.CompletedProcess([script, *argv], status,
                                       launcher_out.getvalue() + texts["out"],
                                       launcher_err.getvalue() + texts["err"])
