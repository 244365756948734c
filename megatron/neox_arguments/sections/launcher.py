"""The launcher section: which hosts and processes run, and what each worker inherits."""

from __future__ import annotations

from dataclasses import dataclass

from ..fields import option

DEFAULT_EXPORT_ENV_VARS = ["WANDB_API_KEY", "WANDB_MODE", "COMET_API_KEY", "HF_TOKEN", "HF_HOME",
                           "PYTHONPATH"]
# GPT-NeoX's and DeepSpeed's rendezvous port: every node of a multi-node job must agree on it.
MULTI_NODE_MASTER_PORT = 29500
# Launchers that start workers through an MPI library and set its rank variables.
MPI_LAUNCHERS = ("openmpi", "mpich", "impi", "mvapich")


@dataclass(frozen=True)
class LauncherArgs:
    """Read by deepy.py before any worker starts; workers see the resolved world size."""

    hostfile: str | None = option(
        None, "MPI-style hostfile, one `hostname slots=N` line per node."
    )
    include: str | None = option(
        None, "Hosts/slots to use, e.g. \"worker-0@worker-1:0,2\" (DeepSpeed's --include)."
    )
    exclude: str | None = option(None, "Hosts/slots to leave out (same format as include).")
    num_nodes: int = option(-1, "Nodes to run on, the first ones of the hostfile; -1 means all.")
    num_gpus: int | None = option(
        None,
        "Processes per node: GPUs per node, or CPU processes on a machine without GPUs; "
        "null means all GPUs (the launcher counts them; config checks assume 1, or one "
        "model replica per node if 1 is too few).",
    )
    global_num_gpus: int | None = option(
        None,
        "GPT-NeoX's total process count. The world size is derived here (num_nodes * "
        "num_gpus, or the hostfile's slots at launch); a value given must equal it.",
    )
    master_addr: str | None = option(
        None, "Address of the rank-0 node (null: the first host, or localhost)."
    )
    master_port: int | None = option(
        None,
        "TCP port of the rank-0 rendezvous; null: a free port on this machine without a "
        "hostfile, 29500 (GPT-NeoX's) with one. A busy port set here fails the launch.",
    )
    launcher: str = option(
        "pdsh",
        "Multi-node launcher: pdsh, openmpi, mvapich, slurm, jsrun, mpich or impi.",
    )
    deepspeed_mpi: bool = option(
        False,
        "Workers take rank, local rank and world size from MPI's variables "
        "(OMPI_COMM_WORLD_RANK, PMI_RANK, ...) before RANK; needs a hostfile and an MPI launcher.",
    )
    deepspeed_slurm: bool = option(
        False,
        "Workers take rank, local rank and world size from srun's variables (SLURM_PROCID, "
        "SLURM_NTASKS, SLURM_LOCALID) before RANK; needs launcher slurm, and deepy.py needs "
        "a hostfile of the allocation's nodes to start them.",
    )
    comment: str | None = option(None, "Comment passed to the launcher (e.g. SLURM --comment).")
    account: str | None = option(None, "Account passed to the scheduler (e.g. SLURM --account).")
    no_ssh: bool = option(
        False,
        "Start this node's workers locally instead of over ssh; run once per node with node_rank.",
    )
    node_rank: int | None = option(
        None, "This node's rank (0 .. num_nodes-1) when launching per node with no_ssh."
    )
    no_ssh_check: bool = option(
        False,
        "Skip the check before launching that the hosts answer ssh: every host with pdsh, the "
        "first one (DeepSpeed's check) with mpirun.",
    )
    max_restarts: int = option(
        0,
        "Restarts after the workers fail (a worker killed or crashed, a hang): the job starts "
        "again from the newest valid checkpoint in `save`, up to this many times. Not after a "
        "finished run, a stop on SIGTERM/SIGINT, or a guard stop (bad_step_policy).",
    )
    export_env_vars: list[str] = option(
        DEFAULT_EXPORT_ENV_VARS,
        "Environment variables copied from the launching shell to every worker when set there.",
    )
    env_file_dir: str | None = option(
        None,
        "Folder of the owner-only file that carries export_env_vars to the workers of a "
        "hostfile launch over ssh, pdsh, MPI or SLURM (their values never go on a command "
        "line); every node must read it at the same path, so a shared filesystem. null: "
        "~/.cache/neox (the home folder is shared on most clusters).",
    )
    signal_grace_seconds: float = option(
        600.0,
        "After SIGTERM/SIGINT reaches deepy.py (passed on to the workers, which finish the "
        "step and save when save_on_signal is set), seconds to wait for them to exit before "
        "killing them.",
    )
    omp_num_threads: int | None = option(
        None, "OMP_NUM_THREADS of each worker (null: CPU cores // processes per node)."
    )
    memory_check: bool | str = option(
        True,
        "Before any worker starts, deepy.py prints the per-worker memory estimate and refuses "
        "a run that needs more than this machine has (true); 'warn' prints the same refusal "
        "as a warning and starts the workers; false skips the comparison.",
    )
    distributed_timeout_minutes: float = option(
        10.0,
        "Timeout of distributed initialisation and collectives, in minutes; fractions allowed "
        "(0.05 = 3 s, as tests use).",
    )
