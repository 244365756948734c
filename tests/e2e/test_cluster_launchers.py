"""`python deepy.py train.py ...` through DeepSpeed's multi-node runners, each starting two real
workers of the tiny model on this machine: mpirun (Open MPI from the `mpi` test extra), srun
(the stand-in in srun_standin.py always; a real one-node SLURM cluster where SLURM is installed
and the test runs as root) and pdsh over ssh to `localhost` and `127.0.0.1` (an sshd of the
test's own). The ones that need system packages skip, saying which, where they are missing;
`.ci/run` installs them when it runs as root with apt-get."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e import local_slurm, local_sshd
from tests.runs import SHORT_RUN, clean_env, deepy, explain, read_metrics, tiny_overrides


def train_with_launcher(small_data, run: Path, hosts: str, env: dict, **overrides):
    """deepy.py on the tiny config with a hostfile of `hosts`; the finished process."""
    prefix, tok = small_data
    hostfile = run.parent / "hostfile"
    hostfile.write_text(hosts)
    temp = run.parent / "tmp"  # where deepy.py writes the variables file DeepSpeed's runner reads
    temp.mkdir()
    return deepy("train.py", "configs/tiny.yml",
                 *tiny_overrides(prefix, tok, run, hostfile=hostfile, omp_num_threads=1,
                                 **SHORT_RUN, **overrides), env={**env, "TMPDIR": str(temp)})


def assert_trained_as_one_world_of_two(proc, run: Path, deepspeed_runner: bool = True):
    assert proc.returncode == 0, explain(proc)
    assert "dp=2" in proc.stdout  # rank 0's summary: two data-parallel ranks
    if deepspeed_runner:  # the variables file its runner exported is gone with the run, and
        # the runner's notes naming it are not printed
        assert not list((run.parent / "tmp").glob("neox_env_*"))
        assert "deepspeed_env file = " not in proc.stdout + proc.stderr, explain(proc)
    train, val = read_metrics(run / "logs")
    assert [r["iteration"] for r in train] == [2, 4] and len(val) == 1
    assert (run / "ckpt" / "global_step4" / "mp_rank_00_model_states.pt").is_file()


def open_mpi_bin() -> str:
    """The folder of Open MPI's mpirun and ompi_info: the `mpi` test extra's, beside this
    Python, else the PATH's."""
    for path in (str(Path(sys.executable).parent), None):
        mpirun, info = shutil.which("mpirun", path=path), shutil.which("ompi_info", path=path)
        if mpirun and info:
            return str(Path(mpirun).parent)
    raise AssertionError("Open MPI's mpirun is missing: install the test extra (pip install -e "
                         "'.[dev,mpi]', as `make test` does), which ships it")


def test_mpirun_starts_the_workers_through_deepy(small_data, tmp_path):
    """launcher: openmpi with GPT-NeoX's deepspeed_mpi, on a hostfile of this machine: DeepSpeed's
    runner starts both workers with a real mpirun; they learn their ranks from Open MPI."""
    env = clean_env(PATH=open_mpi_bin() + os.pathsep + os.environ.get("PATH", ""))
    if os.geteuid() == 0:  # Open MPI refuses root unless told twice
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    run = tmp_path / "run"
    proc = train_with_launcher(small_data, run, "localhost slots=2\n", env, launcher="openmpi",
                               deepspeed_mpi=True, no_ssh_check=True, master_addr="127.0.0.1")
    assert_trained_as_one_world_of_two(proc, run)
    assert "mpirun -n 2 -hostfile" in proc.stdout + proc.stderr  # DeepSpeed's runner's command
    assert "world of 2 ranks from Open MPI's variables; master 127.0.0.1" in proc.stderr


def srun_standin_bin(folder: Path) -> Path:
    """A folder with `srun` (the stand-in) and `sinfo` (DeepSpeed's runner only looks it up)."""
    folder.mkdir()
    standin = Path(__file__).with_name("srun_standin.py")
    (folder / "srun").write_text(f'#!/bin/sh\nexec {sys.executable} {standin} "$@"\n')
    (folder / "sinfo").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("srun", "sinfo"):
        (folder / tool).chmod(0o755)
    return folder


def test_deepspeed_slurm_starts_workers_the_way_srun_does(small_data, tmp_path):
    """GPT-NeoX's deepspeed_slurm: DeepSpeed's slurm runner builds its srun command (no master
    address, no ssh to a compute node, no GPU request for a CPU run), and two tasks started
    with exactly that argv and srun's variables, no RANK/WORLD_SIZE, form one world."""
    path = f"{srun_standin_bin(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}"
    run = tmp_path / "run"
    proc = train_with_launcher(small_data, run, "localhost slots=2\n", clean_env(PATH=path),
                               launcher="slurm", deepspeed_slurm=True)
    assert_trained_as_one_world_of_two(proc, run)
    assert "srun -n 2 --export=ALL," in proc.stdout  # DeepSpeed's runner's command
    assert "--gpus-per-node" not in proc.stdout
    assert "world of 2 ranks from SLURM's variables; master localhost:" in proc.stderr


def test_real_srun_on_a_one_node_cluster_trains(small_data, tmp_path):
    """The same launch through a real srun, on a SLURM cluster of this one machine."""
    reason = local_slurm.missing()
    if reason:
        pytest.skip(reason)
    run = tmp_path / "run"
    with local_slurm.local_slurm(tmp_path / "slurm") as slurm_env:
        proc = train_with_launcher(small_data, run, "localhost slots=2\n",
                                   clean_env(**slurm_env), launcher="slurm",
                                   deepspeed_slurm=True)
    assert_trained_as_one_world_of_two(proc, run)
    assert "srun -n 2 --export=ALL," in proc.stdout
    assert "world of 2 ranks from SLURM's variables; master localhost:" in proc.stderr


def pdsh_missing() -> str | None:
    return local_sshd.missing() or (None if shutil.which("pdsh") else
                                    "pdsh is not installed (Debian/Ubuntu: apt-get install pdsh)")


def test_pdsh_over_ssh_starts_one_worker_on_each_of_two_nodes(small_data, tmp_path):
    """launcher: pdsh (GPT-NeoX's default) on a hostfile of two "nodes", localhost and
    127.0.0.1: pdsh runs the node launcher on each over ssh, in this directory and Python, with
    the exported variables; the secrets travel in the owner-only file, removed with the run.
    Without master_addr the master is the first host's first address, which deepy.py asks it
    for over ssh (`hostname -I`), as DeepSpeed's runner does."""
    reason = pdsh_missing()
    if reason:
        pytest.skip(reason)
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    run = tmp_path / "run"
    secret = "fake-secret-hf-token-0123456789"  # A34: exported, never on pdsh's command line
    with local_sshd.local_sshd(tmp_path / "sshd") as ssh_env:
        proc = train_with_launcher(small_data, run, "localhost slots=1\n127.0.0.1 slots=1\n",
                                   clean_env(**ssh_env, HF_TOKEN=secret), launcher="pdsh",
                                   num_gpus=1, env_file_dir=tmp_path / "shared",
                                   # a machine without a network address: the loopback one
                                   **({} if addresses else {"master_addr": "127.0.0.1"}))
    assert_trained_as_one_world_of_two(proc, run, deepspeed_runner=False)
    out = proc.stdout + proc.stderr
    if addresses:
        assert (f"master address {addresses[0]} (hostname -I on localhost; set master_addr to "
                "choose)") in out, explain(proc)
    assert secret not in out and "--neox_args" not in out
    assert list((tmp_path / "shared").iterdir()) == []  # removed with the run
    assert ("pdsh -S -f 1024 -w localhost,127.0.0.1 python -m megatron.launching.node train.py; "
            "exported: ") in out and "NEOX_ENV_FILE" in out
    lines = out.splitlines()
    for node, host in enumerate(("localhost", "127.0.0.1")):  # pdsh prefixes each node's lines
        assert any(line.startswith(f"{host}: ") and f"node {node} of 2 ({host}): launching 1 "
                   f"worker(s), ranks {node}-{node} of 2" in line for line in lines), explain(proc)
