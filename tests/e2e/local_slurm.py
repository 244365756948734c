"""A one-node SLURM cluster run by the test itself: slurmctld and slurmd as child processes.

    with local_slurm(tmp_path) as env:      # env: SLURM_CONF pointing at the cluster's config
        subprocess.run(["srun", "-n", "2", "hostname"], env={**os.environ, **env})

The node is named `localhost` (so srun's SLURM_STEP_NODELIST is an address every worker can
reach), the daemons listen on free ports, keep their state under `tmp_path`, and authenticate
with auth/none, so nothing of the machine's own SLURM or munge is used or touched. No systemd:
both daemons run in the foreground (-D) and are stopped when the block ends. slurmd starts job
steps as their owner, which needs root; `missing()` says why a cluster cannot be started here.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.runs import free_port

DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("srun", "sinfo")
SBIN = os.pathsep.join(("/usr/sbin", "/sbin", os.environ.get("PATH", "")))

CONFIG = """\
ClusterName=neoxtest
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def missing() -> str | None:
    """Why a one-node cluster cannot run here, or None when it can."""
    absent = [name for name in DAEMONS if not shutil.which(name, path=SBIN)]
    absent += [name for name in CLIENTS if not shutil.which(name)]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} not found; Debian/Ubuntu: "
                "apt-get install slurmd slurmctld slurm-client)")
    if os.geteuid() != 0:
        return "slurmd starts job steps as their owner and needs root"
    return None


@contextlib.contextmanager
def local_slurm(workdir: Path, cpus: int = 2, timeout: float = 30.0):
    """Start the cluster, wait until its node takes jobs, yield {"SLURM_CONF": path}, stop it."""
    workdir.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool"):
        (workdir / sub).mkdir(exist_ok=True)
    conf = workdir / "slurm.conf"
    conf.write_text(CONFIG.format(dir=workdir, ctld_port=free_port(), slurmd_port=free_port(),
                                  cpus=cpus))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    daemons = [subprocess.Popen([shutil.which("slurmctld", path=SBIN), "-D", "-c", "-i"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
               subprocess.Popen([shutil.which("slurmd", path=SBIN), "-D", "-N", "localhost"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    try:
        _wait_until_idle(env, daemons, workdir, timeout)
        yield {"SLURM_CONF": str(conf)}
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _wait_until_idle(env: dict, daemons: list, workdir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        if any(d.poll() is not None for d in daemons):
            break
        probe = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True,
                               text=True)
        state = probe.stdout.strip()
        if state == "idle":
            return
        time.sleep(0.3)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                     for p in sorted(workdir.glob("*.log")))
    raise AssertionError(f"the one-node SLURM cluster did not come up (node state {state!r})\n"
                         + logs)
