"""A two-worker tiny run as users stop it or lose it: a worker killed by SIGKILL mid-training,
SIGTERM (Kubernetes, `kill`) and SIGINT (Ctrl-C) sent to deepy.py's own PID, an error every
rank meets (A34). What a user relies on: one line naming the dead worker's rank and signal, or
the workers' own error once and nothing more; deepy.py's exit status, the last checkpoint
intact, and no worker process left once deepy.py has exited."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from megatron.checkpointing.manifest import check_files, read_manifest
from tests.e2e import local_slurm
from tests.e2e.test_cluster_launchers import open_mpi_bin
from tests.runs import ROOT, clean_env, deepy, explain, tiny_overrides, wait_for_text


def start(small_data, run: Path, **extra) -> tuple[subprocess.Popen, Path]:
    """deepy.py on a long tiny run (checkpoints every 4 steps); its combined output's file."""
    log = run.parent / f"{run.name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
             *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=4,
                             eval_interval=1000, log_interval=1, **extra)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def workers(deepy: subprocess.Popen) -> dict[int, psutil.Process]:
    """{rank: process} of the training workers deepy.py started."""
    found = {}
    for child in psutil.Process(deepy.pid).children():
        try:
            if "train.py" in child.cmdline():
                found[int(child.environ()["RANK"])] = child
        except psutil.NoSuchProcess:
            continue
    return found


def left_over(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p)
            and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def stop_with(proc: subprocess.Popen, log: Path, signum: int, status: int,
              before=lambda: None) -> str:
    """Once `proc` has logged iteration 3: `before()`, `signum` to it, its exit with `status`;
    its whole output."""
    try:
        wait_for_text(log, "iteration      3/", proc)
        before()
        proc.send_signal(signum)
        assert proc.wait(timeout=300) == status, log.read_text()[-3000:]
    finally:
        proc.kill()
    return log.read_text()


def assert_latest_checkpoint_intact(ckpt: Path) -> int:
    tag = (ckpt / "latest").read_text().strip()
    manifest = read_manifest(ckpt / tag)
    assert check_files(ckpt / tag, manifest, hash_names=list(manifest.files)) == []
    return int(tag[len("global_step"):])


@pytest.mark.slow
def test_a_worker_killed_by_sigkill_is_named_and_the_other_is_stopped(small_data, tmp_path):
    run = tmp_path / "run"
    proc, log = start(small_data, run)
    pids = []
    try:
        wait_for_text(log, "iteration      6/", proc)  # past the checkpoint of step 4
        found = workers(proc)
        pids = [p.pid for p in found.values()]
        assert sorted(found) == [0, 1]
        found[1].send_signal(signal.SIGKILL)
        status = proc.wait(timeout=300)
    finally:
        proc.kill()
    out = log.read_text()
    assert status == 137, out[-3000:]  # 128 + SIGKILL: the dead worker's, as a shell says it
    died = [line for line in out.splitlines() if " died: " in line]
    assert died == [f"worker rank 1 (local rank 1) on {socket.gethostname()} died: "
                    "killed by SIGKILL"], out[-3000:]
    assert "stopping the other 1 worker(s)" in out
    assert "--neox_args" not in out and "return code" not in out
    assert not left_over(pids)
    assert assert_latest_checkpoint_intact(run / "ckpt") >= 4


def damaged_resume(trained, tmp_path: Path, **extra) -> tuple[list[str], Path]:
    """deepy.py's arguments for two workers resuming a copy of the trained checkpoint with one
    byte of a layer file flipped, which every rank refuses alike (status 1); the copy's path."""
    save = tmp_path / "ckpt"
    shutil.copytree(trained["ckpt"], save)
    target = save / (save / "latest").read_text().strip() / "layer_02-model_00-model_states.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    values = {"save": save, "load": save, "train_iters": 40, "num_gpus": 2,
              "override_lr_scheduler": True, **extra}
    return ["train.py", "configs/tiny.yml",
            *tiny_overrides(trained["data"], trained["tokenizer"], tmp_path / "run",
                            **values)], save


def assert_one_error(proc, text: str) -> None:
    """The run's one error line says `text` for both ranks, or for the one that met it first
    (on a loaded machine the other may reach it more than a second later, and be stopped)."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and re.fullmatch(
        rf"error \(ranks? (0-1|0|1) on {re.escape(socket.gethostname())}\): {re.escape(text)}",
        errors[0]), explain(proc)


def test_an_error_every_worker_explains_is_printed_once_with_no_death_line(trained, tmp_path):
    """Each worker prints `error (rank R on HOST): ...` and exits 1: deepy.py prints the error
    once for both ranks, says nothing more about their deaths, and exits 1."""
    argv, save = damaged_resume(trained, tmp_path)
    proc = deepy(*argv, env=clean_env())
    assert proc.returncode == 1, explain(proc)
    assert_one_error(proc, f"no checkpoint in {save} can be loaded:")
    assert " died: " not in proc.stderr and "Traceback" not in proc.stderr, explain(proc)


def test_workers_that_crash_without_an_error_line_still_get_their_death_line(trained, tmp_path):
    """The same failure with NEOX_TRACEBACK=1: each worker ends on a traceback, which names no
    rank, and exits 1; deepy.py says which workers died."""
    argv, _save = damaged_resume(trained, tmp_path)
    proc = deepy(*argv, env=clean_env(NEOX_TRACEBACK="1"))
    assert proc.returncode == 1, explain(proc)
    assert "Traceback" in proc.stderr, explain(proc)
    died = [line for line in proc.stderr.splitlines() if " died: " in line]
    # both ranks fail within a second of each other and share the line, or the first dies
    # alone and the other is stopped
    assert len(died) == 1 and died[0].startswith("worker rank"), explain(proc)
    assert died[0].endswith(f" on {socket.gethostname()} died: exited with status 1"), \
        explain(proc)


def deepy_under_mpirun(argv: list[str], tmp_path: Path, **env) -> subprocess.CompletedProcess:
    """deepy.py with `argv` through DeepSpeed's runner and a real mpirun (two workers here)."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    env = clean_env(PATH=open_mpi_bin() + os.pathsep + os.environ.get("PATH", ""), **env)
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return deepy(*argv, f"hostfile={hostfile}", "launcher=openmpi", "deepspeed_mpi=true",
                 "no_ssh_check=true", "master_addr=127.0.0.1", env=env)


def test_under_mpirun_an_error_every_worker_explains_is_printed_once(trained, tmp_path):
    """The same failure through DeepSpeed's runner and a real mpirun: the ranks' error once,
    and neither mpirun's box about the exit nor a death line."""
    argv, save = damaged_resume(trained, tmp_path)
    proc = deepy_under_mpirun(argv, tmp_path)
    assert proc.returncode == 1, explain(proc)
    assert_one_error(proc, f"no checkpoint in {save} can be loaded:")
    assert " died: " not in proc.stderr and "non-zero status" not in proc.stderr, explain(proc)


def test_under_mpirun_the_variables_of_deepspeed_env_reach_the_workers(trained, tmp_path):
    """DeepSpeed's runner reads only the file of variables deepy.py gives it; those of the
    user's ~/.deepspeed_env reach the workers too (here NEOX_TRACEBACK=1: each worker ends on
    its traceback), and its values are not on mpirun's command line."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NEOX_TRACEBACK=1\nNEOX_TEST_MARK=v4lue-0f-the-file\n")
    argv, _save = damaged_resume(trained, tmp_path)
    proc = deepy_under_mpirun(argv, tmp_path, HOME=str(home))
    assert proc.returncode == 1, explain(proc)
    assert "Traceback" in proc.stderr, explain(proc)
    assert "v4lue-0f-the-file" not in proc.stdout + proc.stderr, explain(proc)


@pytest.mark.slow
@pytest.mark.parametrize("signum,status,word", [(signal.SIGTERM, 143, "preempted"),
                                                (signal.SIGINT, 130, "interrupted")],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_deepy_reaches_every_worker_which_save_and_exit(small_data, tmp_path,
                                                                     signum, status, word):
    run = tmp_path / "run"
    proc, log = start(small_data, run)
    pids = []

    def note_workers():
        pids.extend(p.pid for p in workers(proc).values())
        assert len(pids) == 2

    out = stop_with(proc, log, signum, status, before=note_workers)
    name = signal.Signals(signum).name
    assert f"deepy.py: received {name}: passing it to the workers" in out
    latest = assert_latest_checkpoint_intact(run / "ckpt")
    assert f"{word} ({name}) at iteration {latest}; checkpoint {run / 'ckpt'}/global_step" \
           f"{latest}" in out, out[-3000:]
    assert latest >= 3 and " died: " not in out and "did not exit" not in out
    assert not left_over(pids)


def start_under_mpirun(small_data, tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    """deepy.py through DeepSpeed's runner and a real mpirun (two workers on this machine) on a
    long tiny run; (process, output file, run directory)."""
    env = clean_env(PATH=open_mpi_bin() + os.pathsep + os.environ.get("PATH", ""))
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    run = tmp_path / "run"
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
             *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=1000,
                             eval_interval=1000, log_interval=1, hostfile=hostfile,
                             launcher="openmpi", deepspeed_mpi=True, no_ssh_check=True,
                             master_addr="127.0.0.1", omp_num_threads=1)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    return proc, log, run


@pytest.mark.slow
def test_sigterm_to_deepy_under_mpirun_reaches_the_workers_which_save(small_data, tmp_path):
    """mpirun ends its processes at once on SIGTERM; deepy.py passes the stop on as SIGUSR1,
    which mpirun forwards, so the workers (not their loader processes) save and exit."""
    proc, log, run = start_under_mpirun(small_data, tmp_path)
    out = stop_with(proc, log, signal.SIGTERM, 143)
    latest = assert_latest_checkpoint_intact(run / "ckpt")
    assert latest >= 3
    assert f"preempted (SIGUSR1) at iteration {latest}; checkpoint {run / 'ckpt'}/global_step" \
           f"{latest}" in out, out[-3000:]
    assert "DataLoader worker" not in out and "exited with non-zero status" not in out


@pytest.mark.slow
def test_sigterm_to_deepy_under_a_real_srun_reaches_the_workers_which_save(small_data, tmp_path):
    """srun ends the step at once on SIGTERM; deepy.py passes the stop on as SIGUSR1, which srun
    forwards to every task, and srun's report of the tasks' exit after saving is no death."""
    reason = local_slurm.missing()
    if reason:
        pytest.skip(reason)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    run, log = tmp_path / "run", tmp_path / "run.log"
    with local_slurm.local_slurm(tmp_path / "slurm") as slurm_env, open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deepy.py"), "train.py", "configs/tiny.yml",
             *tiny_overrides(*small_data, run, train_iters=2000, checkpoint_factor=1000,
                             eval_interval=1000, log_interval=1, hostfile=hostfile,
                             launcher="slurm", deepspeed_slurm=True, omp_num_threads=1)],
            cwd=ROOT, env=clean_env(**slurm_env), stdout=out, stderr=subprocess.STDOUT)
        text = stop_with(proc, log, signal.SIGTERM, 143)
    latest = assert_latest_checkpoint_intact(run / "ckpt")
    assert f"preempted (SIGUSR1) at iteration {latest}; checkpoint" in text, text[-3000:]
    assert " died: " not in text and "CANCELLED" not in text


@pytest.mark.slow
def test_mpiruns_report_of_a_killed_worker_becomes_one_line(small_data, tmp_path):
    """Through DeepSpeed's runner and a real mpirun: the rank and node come from mpirun."""
    proc, log, _run = start_under_mpirun(small_data, tmp_path)
    try:
        wait_for_text(log, "iteration      3/", proc)
        ranks = {}
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "train.py" in p.cmdline():  # the worker, or a data loader it started later
                    rank = int(p.environ()["OMPI_COMM_WORLD_RANK"])
                    if rank not in ranks or p.create_time() < ranks[rank].create_time():
                        ranks[rank] = p
            except (psutil.Error, KeyError):
                continue
        assert sorted(ranks) == [0, 1]
        ranks[1].send_signal(signal.SIGKILL)
        status = proc.wait(timeout=300)
    finally:
        proc.kill()
    out = log.read_text()
    assert status != 0
    assert "worker rank 1 on " in out and "died: killed by SIGKILL" in out, out[-3000:]
    assert not left_over([p.pid for p in ranks.values()])
