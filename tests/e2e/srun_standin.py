"""A stand-in for `srun` on one node: what DeepSpeed's slurm runner asks of srun, without SLURM.

    python tests/e2e/srun_standin.py -n 2 --export=ALL,MASTER_PORT=29500 python -u train.py ...

starts the command `-n` times on this machine, each task with the variables a real srun sets
(SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID, SLURM_STEP_NODELIST, ...; the names
and values are those srun 22.05 gave two tasks on a one-node cluster named `localhost`) and the
`--export` additions. When a task fails it ends the others and exits with that task's status.
Like a CPU-only partition it refuses a GPU request (--gpus-per-node), and it refuses options it
does not know, so a change in what the runner passes shows up here instead of on a cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys

NODE = "localhost"
# srun options DeepSpeed's slurm runner may pass, each with one value
KNOWN_OPTIONS = ("-n", "--comment", "--account", "--nodes", "--nodelist")
GPU_OPTIONS = ("--gpus-per-node", "--gpus", "--gres")


def parse(argv: list[str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(options, --export additions, the command) from srun's command line."""
    options, exports, i = {}, {}, 0
    while i < len(argv) and argv[i].startswith("-"):
        name, _, value = argv[i].partition("=")
        if name in GPU_OPTIONS:
            sys.exit("srun: error: Invalid generic resource (gres) specification")
        if name == "--export":
            exports = export_additions(value)
            i += 1
            continue
        if name not in KNOWN_OPTIONS:
            sys.exit(f"srun stand-in: unsupported option {argv[i]!r}")
        if not value:
            i += 1
            value = argv[i]
        options[name] = value
        i += 1
    if i == len(argv):
        sys.exit("srun: fatal: No command given to execute.")
    return options, exports, argv[i:]


def export_additions(value: str) -> dict[str, str]:
    """srun's --export=ALL,K=V,...: everything here plus K=V (a bare NAME keeps its value)."""
    items = value.split(",")
    if items[0] != "ALL":
        sys.exit(f"srun stand-in: only --export=ALL,... is supported, got --export={value}")
    return dict(item.split("=", 1) for item in items[1:] if "=" in item)


def task_env(rank: int, ntasks: int, exports: dict[str, str]) -> dict[str, str]:
    """The environment srun gives task `rank` of `ntasks`, all on this one node."""
    job = {"SLURM_JOB_ID": "1", "SLURM_JOBID": "1", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
           "SLURM_JOB_NODELIST": NODE, "SLURM_NODELIST": NODE, "SLURM_STEP_NODELIST": NODE,
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_NTASKS": str(ntasks), "SLURM_NPROCS": str(ntasks),
           "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_TASKS_PER_NODE": str(ntasks),
           "SLURM_STEP_TASKS_PER_NODE": str(ntasks), "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
           "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURMD_NODENAME": NODE,
           "SLURM_SUBMIT_DIR": os.getcwd(), "SLURM_GTIDS": ",".join(map(str, range(ntasks)))}
    task = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0"}
    return {**os.environ, **exports, **job, **task}


def main(argv: list[str]) -> int:
    options, exports, command = parse(argv)
    ntasks = int(options.get("-n", "1"))
    tasks = [subprocess.Popen(command, env=task_env(rank, ntasks, exports))
             for rank in range(ntasks)]
    running, status = {task.pid: task for task in tasks}, 0
    while running:
        pid, wait_status = os.wait()
        if running.pop(pid, None) is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        if code and not status:  # as srun: one task failing ends the step
            status = code if code > 0 else 128 - code
            for task in running.values():
                task.terminate()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
