"""Where this worker sits in the job (rank, local rank, world size, master), from its launcher.

Each launcher announces a worker's place in its own variables:

    DeepSpeed's launcher, torchrun   RANK, WORLD_SIZE, LOCAL_RANK
    Open MPI (mpirun)                OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK
    PMI (MPICH, Intel MPI, MVAPICH)  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID / PMI_LOCAL_RANK / ...
    SLURM (srun)                     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID

The first launcher in that order whose rank variable is set is the one that started the worker;
its other variables must then be set too. `deepspeed_mpi` / `deepspeed_slurm` (GPT-NeoX's keys)
read only the MPI / SLURM variables, before RANK. The master's address and port come from
MASTER_ADDR / MASTER_PORT when set (DeepSpeed's launcher sets them; deepy.py exports them to
workers of mpirun and srun); for srun the first host of the step's node list is the address
otherwise. What is still missing is filled from the config by `init_distributed`.

    env = read_launch_env(os.environ)   # -> LaunchEnv(rank=1, local_rank=1, world_size=2, ...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class RankVariables:
    """The variables one kind of launcher sets; the first set name of each tuple counts."""

    launcher: str
    rank: str
    world_size: tuple[str, ...]
    local_rank: tuple[str, ...]


TORCH = RankVariables("DeepSpeed/torchrun", "RANK", ("WORLD_SIZE",), ("LOCAL_RANK",))
OPEN_MPI = RankVariables("Open MPI", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
                         ("OMPI_COMM_WORLD_LOCAL_RANK",))
PMI = RankVariables("PMI (MPICH, Intel MPI, MVAPICH)", "PMI_RANK", ("PMI_SIZE",),
                    ("MPI_LOCALRANKID", "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK"))
SLURM = RankVariables("SLURM", "SLURM_PROCID", ("SLURM_NTASKS", "SLURM_NPROCS"),
                      ("SLURM_LOCALID",))

# Which launchers' variables are read, in order: by default any; with GPT-NeoX's keys only MPI's
# or SLURM's (they win over a RANK left in the environment, as in GPT-NeoX).
DISCOVERY: dict[str, tuple[RankVariables, ...]] = {
    "auto": (TORCH, OPEN_MPI, PMI, SLURM),
    "mpi": (OPEN_MPI, PMI),
    "slurm": (SLURM,),
}
_DISCOVERY_KEY = {"mpi": "deepspeed_mpi", "slurm": "deepspeed_slurm"}
# srun's node lists: the step's own first, then the job's.
SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")


@dataclass(frozen=True)
class LaunchEnv:
    """This worker's place in the job; master_addr / master_port are None when not announced."""

    rank: int
    local_rank: int
    world_size: int
    master_addr: str | None
    master_port: int | None
    launcher: str

    def as_torch_env(self) -> dict[str, str]:
        """The variables torch's env:// rendezvous, DeepSpeed and this project read."""
        assert self.master_addr is not None and self.master_port is not None
        return {"RANK": str(self.rank), "LOCAL_RANK": str(self.local_rank),
                "WORLD_SIZE": str(self.world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def discovery_mode(deepspeed_mpi: bool, deepspeed_slurm: bool) -> str:
    """The DISCOVERY key that the config's deepspeed_mpi / deepspeed_slurm select."""
    return "mpi" if deepspeed_mpi else "slurm" if deepspeed_slurm else "auto"


def read_launch_env(environ: Mapping[str, str], mode: str = "auto") -> LaunchEnv:
    """This worker's rank, local rank, world size and master from the launcher's variables."""
    candidates = DISCOVERY[mode]
    found = next((v for v in candidates if _get(environ, v.rank) is not None), None)
    if found is None:
        raise RuntimeError(_nothing_set_message(candidates, mode))
    world_name = next((n for n in found.world_size if _get(environ, n) is not None), None)
    local_name = next((n for n in found.local_rank if _get(environ, n) is not None), None)
    missing = [" or ".join(names) for names, got in ((found.world_size, world_name),
                                                    (found.local_rank, local_name)) if got is None]
    if missing:
        raise RuntimeError(
            f"{found.rank} is set ({found.launcher} started this worker) but "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not; the launcher "
            "sets them all, so start workers through it (python deepy.py <script> <configs>)")
    rank, world = _int(environ, found.rank), _int(environ, world_name)
    local_rank = _int(environ, local_name)
    if world < 1 or not 0 <= rank < world or local_rank < 0:
        raise RuntimeError(f"{found.rank}({rank}), {world_name}({world}) and "
                           f"{local_name}({local_rank}) do not describe a worker: need "
                           f"0 <= {found.rank} < {world_name} and {local_name} >= 0")
    addr = _get(environ, "MASTER_ADDR")
    if addr is None and found is SLURM:
        nodelist = next((_get(environ, n) for n in SLURM_NODELISTS if _get(environ, n)), None)
        addr = first_slurm_host(nodelist) if nodelist else None
    port = _int(environ, "MASTER_PORT") if _get(environ, "MASTER_PORT") is not None else None
    return LaunchEnv(rank, local_rank, world, addr, port, found.launcher)


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM host list: 'gpu[03-04,07],cpu1' -> 'gpu03'."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], nodelist[:end])


def _nothing_set_message(candidates: tuple[RankVariables, ...], mode: str) -> str:
    looked = ", ".join(f"{v.rank} ({v.launcher})" for v in candidates)
    if mode != "auto":
        key = _DISCOVERY_KEY[mode]
        return (f"{key} is true but none of {looked} is set: start the workers with the launcher "
                f"that sets them (python deepy.py with the config's launcher and hostfile), or "
                f"set {key}: false")
    return (f"this worker cannot tell its rank: none of {looked} is set. Start workers through "
            "`python deepy.py <script> <configs>` (or mpirun / srun), or set RANK, LOCAL_RANK, "
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT by hand for a single process")


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name)
    return None if value is None else value.strip()


def _int(environ: Mapping[str, str], name: str) -> int:
    value = _get(environ, name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RuntimeError(f"environment variable {name}={value!r} is not an integer; "
                           "check how the launcher sets it") from None
