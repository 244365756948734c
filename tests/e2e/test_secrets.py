"""The values of `export_env_vars` (WANDB_API_KEY, HF_TOKEN, ...) reach the workers and nothing
else (A34): not deepy.py's output, the workers' command lines, metrics.jsonl, wandb's offline
files, the saved configs or the checkpoints' pickles. A real two-worker run of the tiny model
started by deepy.py itself, and one through DeepSpeed's runner and a real mpirun."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.e2e.test_cluster_launchers import open_mpi_bin
from tests.runs import ROOT, SHORT_RUN, clean_env, explain, read_metrics, tiny_overrides

SECRETS = {"WANDB_API_KEY": "fake-secret-wandb-0123456789abcdef",
           "HF_TOKEN": "hf_fake-secret-token-fedcba9876543210"}

# a worker script: train.py, after saying how long each secret it sees is
PROBE = f"""import os, sys
sys.path.insert(0, {str(ROOT)!r})
from megatron.entry import run_entry
from megatron.launcher import worker_args

def run():
    lengths = ", ".join(f"{{k}} of {{len(os.environ.get(k, ''))}} chars" for k in {sorted(SECRETS)!r})
    rank = os.environ.get("RANK") or os.environ["OMPI_COMM_WORLD_RANK"]
    print(f"rank {{rank}} sees {{lengths}}", flush=True)
    from megatron.training.loop import pretrain
    pretrain(worker_args(sys.argv[1:]))

sys.exit(run_entry(run))
"""


def seen_line(rank: int) -> str:
    lengths = ", ".join(f"{k} of {len(SECRETS[k])} chars" for k in sorted(SECRETS))
    return f"rank {rank} sees {lengths}"


def assert_nowhere(texts: dict[str, bytes]) -> None:
    leaks = [(where, name) for where, data in texts.items() for name, value in SECRETS.items()
             if value.encode() in data]
    assert leaks == [], f"secret values found in: {leaks}"


def files_under(*folders: Path) -> dict[str, bytes]:
    found = {str(p): p.read_bytes() for folder in folders for p in folder.rglob("*")
             if p.is_file()}
    assert found, f"nothing written under {folders}"
    return found


def start(probe: Path, run: Path, small_data, env: dict, **overrides) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "deepy.py"), str(probe), "configs/tiny.yml",
         *tiny_overrides(*small_data, run, use_wandb=True, omp_num_threads=1, **SHORT_RUN,
                         **overrides)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def command_lines_while_running(proc: subprocess.Popen, limit: float = 300) -> dict[str, bytes]:
    """/proc/<pid>/cmdline of deepy.py and everything under it, read until it ends (killed,
    with everything under it, after `limit` seconds: the test then fails on its exit status)."""
    seen: dict[str, bytes] = {}
    deadline = time.monotonic() + limit
    while proc.poll() is None:
        try:
            family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        if time.monotonic() > deadline:
            for p in reversed(family):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            break
        for p in family:
            try:
                seen[f"cmdline of {p.pid}"] = Path(f"/proc/{p.pid}/cmdline").read_bytes()
            except OSError:
                continue
        time.sleep(0.5)
    return seen


def test_secrets_reach_local_workers_and_nothing_else(small_data, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    run = tmp_path / "run"
    proc = start(probe, run, small_data, clean_env(WANDB_MODE="offline", **SECRETS))
    cmdlines = command_lines_while_running(proc)
    out, err = proc.communicate(timeout=300)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())
    assert proc.returncode == 0, explain(result)
    assert seen_line(0) in result.stdout and seen_line(1) in result.stdout, explain(result)
    assert len([k for k in cmdlines if k.startswith("cmdline")]) >= 3  # deepy + 2 workers seen
    train, _ = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [2, 4]
    assert (run / "logs" / "wandb").is_dir()  # wandb's offline files are among those searched
    assert_nowhere({"stdout": out, "stderr": err, **cmdlines,
                    **files_under(run / "logs", run / "ckpt")})


def test_secrets_reach_mpirun_workers_through_a_private_file_only(small_data, tmp_path):
    """DeepSpeed's runner would put them on mpirun's command line (`-x K=V`) and print it."""
    env = clean_env(PATH=open_mpi_bin() + os.pathsep + os.environ.get("PATH", ""),
                    WANDB_MODE="offline", **SECRETS)
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    run, env_dir = tmp_path / "run", tmp_path / "shared"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    proc = start(probe, run, small_data, env, hostfile=hostfile, launcher="openmpi",
                 deepspeed_mpi=True, no_ssh_check=True, master_addr="127.0.0.1",
                 env_file_dir=env_dir)
    cmdlines = command_lines_while_running(proc)
    out, err = proc.communicate(timeout=300)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode())
    assert proc.returncode == 0, explain(result)
    assert "mpirun -n 2 -hostfile" in result.stdout + result.stderr
    assert seen_line(0) in result.stdout and seen_line(1) in result.stdout, explain(result)
    assert "--neox_args <config>" in result.stdout + result.stderr  # the blob is not printed
    assert any(b"mpirun" in c for c in cmdlines.values())
    assert list(env_dir.iterdir()) == []  # the private file is gone with the run
    assert_nowhere({"stdout": out, "stderr": err, **cmdlines,
                    **files_under(run / "logs", run / "ckpt")})


def test_an_env_file_dir_that_cannot_be_made_is_one_clear_error(small_data, tmp_path):
    (tmp_path / "a-file").write_text("")
    env_dir = tmp_path / "a-file" / "shared"  # under a file: not even root can create it
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    proc = start(probe, tmp_path / "run", small_data, clean_env(**SECRETS), hostfile=hostfile,
                 launcher="openmpi", deepspeed_mpi=True, no_ssh_check=True,
                 master_addr="127.0.0.1", env_file_dir=env_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()[-3000:]
    assert f"error: env_file_dir {env_dir}: cannot create the file carrying export_env_vars " \
           "to the workers (Not a directory)" in err.decode()
    assert b"Traceback" not in err
