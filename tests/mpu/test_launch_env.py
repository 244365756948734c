"""A worker's rank, local rank, world size and master from each launcher's variables, in order."""

import pytest

from megatron.mpu.initialize import resolve_launch_env
from megatron.mpu.launch_env import LaunchEnv, first_slurm_host, read_launch_env
from megatron.neox_arguments import NeoXArgs

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"}
DEEPSPEED = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", **MASTER}
# what `mpirun -n 4` (Open MPI 5) sets on the second host, beside its PMIx variables
OPEN_MPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "PMIX_RANK": "3"}
# MPICH's and Intel MPI's Hydra
HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}
# what `srun -N 2 -n 4` sets in its fourth task
SLURM = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
         "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_JOB_NODELIST": "gpu[01-08]"}


@pytest.mark.parametrize("environ,launcher", [
    (DEEPSPEED, "DeepSpeed/torchrun"),
    ({**OPEN_MPI, **MASTER}, "Open MPI"),
    ({**HYDRA, **MASTER}, "PMI (MPICH, Intel MPI, MVAPICH)"),
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1", **MASTER},
     "PMI (MPICH, Intel MPI, MVAPICH)"),
    ({**SLURM, **MASTER}, "SLURM"),
], ids=["deepspeed", "openmpi", "mpich-hydra", "pmi-local-rank", "slurm"])
def test_each_launcher_gives_the_same_place(environ, launcher):
    assert read_launch_env(environ) == LaunchEnv(rank=3, local_rank=1, world_size=4,
                                                 master_addr="10.0.0.1", master_port=6000,
                                                 launcher=launcher)


def test_precedence_is_rank_then_open_mpi_then_pmi_then_slurm():
    # DeepSpeed's launcher inside an srun step: RANK wins over the step's SLURM_PROCID=0
    inside_step = {**DEEPSPEED, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"}
    assert read_launch_env(inside_step).launcher == "DeepSpeed/torchrun"
    assert read_launch_env({**HYDRA, **OPEN_MPI}).launcher == "Open MPI"
    assert read_launch_env({**SLURM, **HYDRA}).launcher.startswith("PMI")


def test_deepspeed_mpi_and_slurm_read_only_their_variables_and_before_rank():
    stale = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}  # as GPT-NeoX: MPI's/SLURM's win
    assert read_launch_env({**stale, **OPEN_MPI}, "mpi").rank == 3
    assert read_launch_env({**stale, **HYDRA}, "mpi").launcher.startswith("PMI")
    assert read_launch_env({**stale, **SLURM}, "slurm").rank == 3
    with pytest.raises(RuntimeError) as err:
        read_launch_env({**DEEPSPEED, **SLURM}, "mpi")
    assert str(err.value) == (
        "deepspeed_mpi is true but none of OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (PMI "
        "(MPICH, Intel MPI, MVAPICH)) is set: start the workers with the launcher that sets them "
        "(python deepy.py with the config's launcher and hostfile), or set deepspeed_mpi: false")
    with pytest.raises(RuntimeError, match="deepspeed_slurm is true but none of SLURM_PROCID"):
        read_launch_env(OPEN_MPI, "slurm")


def test_no_launcher_names_every_variable_looked_for():
    with pytest.raises(RuntimeError) as err:
        read_launch_env({"MASTER_ADDR": "x", "PATH": "/bin"})
    assert str(err.value).startswith(
        "this worker cannot tell its rank: none of RANK (DeepSpeed/torchrun), "
        "OMPI_COMM_WORLD_RANK (Open MPI), PMI_RANK (PMI (MPICH, Intel MPI, MVAPICH)), "
        "SLURM_PROCID (SLURM) is set. Start workers through `python deepy.py <script> <configs>`")


@pytest.mark.parametrize("environ,message", [
    ({"RANK": "0", "LOCAL_RANK": "0"}, "RANK is set (DeepSpeed/torchrun started this worker) but "
                                       "WORLD_SIZE is not"),
    ({"SLURM_PROCID": "0"}, "SLURM_PROCID is set (SLURM started this worker) but SLURM_NTASKS or "
                            "SLURM_NPROCS and SLURM_LOCALID are not"),
    ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "but MPI_LOCALRANKID or PMI_LOCAL_RANK or "
                                         "MV2_COMM_WORLD_LOCAL_RANK is not"),
    ({**OPEN_MPI, "OMPI_COMM_WORLD_SIZE": "two"},
     "environment variable OMPI_COMM_WORLD_SIZE='two' is not an integer"),
    ({**SLURM, "SLURM_NTASKS": "3"},
     "SLURM_PROCID(3), SLURM_NTASKS(3) and SLURM_LOCALID(1) do not describe a worker: need "
     "0 <= SLURM_PROCID < SLURM_NTASKS"),
], ids=["no-world-size", "slurm-partial", "pmi-no-local-rank", "not-an-integer", "rank-too-big"])
def test_incomplete_or_wrong_variables_are_named(environ, message):
    with pytest.raises(RuntimeError) as err:
        read_launch_env(environ)
    assert message in str(err.value)


def test_slurm_master_is_the_first_host_of_the_step():
    env = read_launch_env(SLURM)
    assert (env.master_addr, env.master_port) == ("gpu07", None)
    only_job = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_NODELIST"}
    assert read_launch_env(only_job).master_addr == "gpu01"
    assert read_launch_env({**SLURM, "MASTER_ADDR": "10.1.1.1"}).master_addr == "10.1.1.1"
    assert read_launch_env(OPEN_MPI).master_addr is None  # mpirun does not say


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("node[03-04,07],cpu1", "node03"), ("a,b", "a"),
    ("rack[2-3]-n[010-012]", "rack2-n010"), ("gpu[5]", "gpu5"),
])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_the_config_fills_what_the_launcher_leaves_out():
    launcher = NeoXArgs.from_ymls(["configs/tiny.yml"], ["master_addr=10.9.9.9"]).launcher
    env = resolve_launch_env(OPEN_MPI, launcher)
    assert (env.master_addr, env.master_port) == ("10.9.9.9", 29500)  # GPT-NeoX's port
    assert env.as_torch_env() == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                                  "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "29500"}
    explicit = NeoXArgs.from_ymls(["configs/tiny.yml"], ["master_port=1234"]).launcher
    assert resolve_launch_env({**OPEN_MPI, **MASTER}, explicit).master_port == 6000  # env wins
    assert resolve_launch_env({**SLURM}, explicit).master_port == 1234
    with pytest.raises(RuntimeError) as err:
        resolve_launch_env(OPEN_MPI, explicit)
    assert str(err.value).startswith("MASTER_ADDR is not set and Open MPI does not say where "
                                     "rank 0 runs: set master_addr in the config")
