"""Launching over pdsh (`launcher: pdsh`, GPT-NeoX's default, with a hostfile of several nodes):
pdsh runs this project's node launcher (megatron.launching.node) on every node over ssh, and
deepy.py relays their output and carries its signals to them.

    status = run_pdsh(launch, worker_argv, exports, env, redactor)

Each node launcher starts and watches its node's workers as deepy.py does on one machine: a
dead worker is named in one line (`worker rank 3 (local rank 1) on node-b died: killed by
SIGKILL`, behind pdsh's `node-b: ` prefix), its node's other workers are stopped, and nothing
of the launch is left on that node when its launcher ends. When a node ends with a failure,
deepy.py tells the others to stop theirs (ABORT). A node launcher reports every death, since
the first sets the run's status; deepy.py leaves out those of workers whose error line already
said why (`error (rank R on HOST): ...`), and then pdsh's report of their node's exit.
SIGTERM / SIGINT to deepy.py reach every node's launcher through a second pdsh (`--signal`):
the workers finish the step and save within `signal_grace_seconds`, after which the node
launchers kill them; deepy.py waits that long plus SIGNAL_MARGIN_SECONDS for pdsh, then kills
what is left everywhere (KILL).

The remote command exports the variables the workers need before Python starts (PYTHON*, the
accelerator's NCCL_* and the like, as DeepSpeed's runner does, and OMP_NUM_THREADS); everything
else of `export_env_vars` and of `.deepspeed_env` files travels in the owner-only file of
megatron.launching.secrets, never on a command line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from megatron.launching.node import MODULE, encode_spec
from megatron.launching.local import PREEMPTED
from megatron.launching.merge import WarningMerger, parse_ranks
from megatron.launching.runner import drain, relay, signal_group
from megatron.launching.secrets import Redactor
from megatron.launching.stopping import LAUNCH_ID_VAR, DeepySignals, kill_tagged

POLL_SECONDS = 0.2
FAN_OUT = 1024  # nodes pdsh reaches at once (DeepSpeed's value)
SIGNAL_MARGIN_SECONDS = 30.0  # beyond the grace time, for ssh and the node launchers' own kill
# variables DeepSpeed's runner exports by prefix (its EXPORT_ENVS and the accelerator's)
EXPORTED_PREFIXES = ("PYTHON", "MLFLOW", "MV2", "UCX", "NCCL")
DEEPSPEED_ENV_FILE = ".deepspeed_env"  # read from the home folder and the working directory
# pdsh: "pdsh@host: node-b: ssh exited with exit code 137"
NODE_EXIT = re.compile(r"^pdsh@\S+: (?P<host>\S+): ssh exited with exit code (?P<rc>\d+)")
SSH_UNREACHABLE = 255
# a node launcher's line for a dead worker (megatron.launching.local.death_line), behind pdsh's
# "node-b: " prefix
DEATH = re.compile(r"(?:(?P<node>[\w.\-]+): )?worker ranks? (?P<ranks>[\d, \-]+) "
                   r"\(local ranks? [\d, \-]+\) on \S+ died: "
                   r"(?:killed by (?P<sig>SIG\w+)|exited with status (?P<rc>\d+))")


@dataclass(frozen=True)
class PdshLaunch:
    """The nodes of a pdsh launch and where their workers meet."""

    hosts: dict[str, list[int]]
    master_addr: str
    master_port: int
    grace_seconds: float

    @property
    def world_size(self) -> int:
        return sum(len(slots) for slots in self.hosts.values())


def check_pdsh() -> None:
    if not shutil.which("pdsh"):
        raise FileNotFoundError("launcher 'pdsh' needs pdsh on this machine (Debian/Ubuntu: "
                                "apt-get install pdsh), with passwordless ssh to every host of the "
                                "hostfile; or set launcher to openmpi or slurm")


def check_ssh(hosts, env: dict[str, str]) -> None:
    """Every host answers over ssh as pdsh will reach it (`pdsh -w HOSTS true`), else an error
    naming each host that does not."""
    out = subprocess.run(["pdsh", "-S", "-w", ",".join(hosts), "true"], env=_pdsh_env(env),
                         capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        return
    labels = {m["host"] for m in map(NODE_EXIT.match, out.stderr.splitlines()) if m}
    # pdsh labels a host by its name up to the first dot: each named as the hostfile has it
    failed = [h for h in hosts if h in labels or h.split(".")[0] in labels]
    said = " | ".join(line.strip() for line in out.stderr.splitlines() if line.strip())
    raise RuntimeError(f"pdsh cannot run a command on {', '.join(failed) or 'every host'} over "
                       f"ssh ({said}); set up passwordless ssh from this machine to every host "
                       "of the hostfile (`ssh HOST hostname` must work without a prompt), or set "
                       "no_ssh_check=true to start without this check")


def first_host_address(host: str, env: dict[str, str]) -> str:
    """The address of `host` as `hostname -I` gives it there (DeepSpeed's runner's way)."""
    out = subprocess.run(["pdsh", "-N", "-w", host, "hostname -I"], env=_pdsh_env(env),
                         capture_output=True, text=True, timeout=60)
    words = out.stdout.split()
    if out.returncode != 0 or not words:
        raise RuntimeError(f"could not learn the address of {host}, the first host of the "
                           f"hostfile, with `hostname -I` over ssh ({out.stderr.strip() or 'no output'}); "
                           "set master_addr to an address of it that every node reaches")
    return words[0]


def node_exports(plan_env: dict[str, str], environ: dict[str, str]) -> dict[str, str]:
    """What the remote command exports: the plan's variables (no secrets among them) and this
    shell's PYTHON*/NCCL_*/... variables that Python or the communication library read at
    start."""
    picked = {k: v for k, v in environ.items() if k.startswith(EXPORTED_PREFIXES)}
    return {**picked, **plan_env}


def deepspeed_env_files(cwd: Path | None = None) -> dict[str, str]:
    """The variables of `.deepspeed_env` in the home folder, then the working directory (a later
    file wins), which DeepSpeed's runner exports to every node: here they go to the workers
    through the owner-only file."""
    values: dict[str, str] = {}
    for folder in (Path.home(), cwd or Path.cwd()):
        path = folder / DEEPSPEED_ENV_FILE
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path} line {number}: {line!r} is not KEY=VALUE")
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def node_command(launch: PdshLaunch, launch_id: str, worker_argv: list[str],
                 exports: dict[str, str], python: str = sys.executable,
                 cwd: str | None = None) -> str:
    """The shell command pdsh runs on every node (%n: the node's index in the -w list)."""
    spec = encode_spec(launch.hosts, launch.master_addr, launch.master_port,
                       launch.grace_seconds, launch_id)
    exported = "".join(f"export {k}={shlex.quote(v)}; " for k, v in exports.items())
    argv = [python, "-u", "-m", MODULE, "--node-rank=%n", f"--spec={spec}", "--", *worker_argv]
    return (f"{exported}cd {shlex.quote(cwd or os.getcwd())} && exec "
            + " ".join(shlex.quote(a) for a in argv))


def pdsh_argv(hosts, command: str) -> list[str]:
    return ["pdsh", "-S", "-f", str(FAN_OUT), "-w", ",".join(hosts), command]


def signal_command(name: str, launch_id: str, python: str = sys.executable) -> str:
    return " ".join(shlex.quote(a) for a in (python, "-m", MODULE, "--node-rank=%n",
                                              f"--signal={name}", f"--launch-id={launch_id}"))


def describe_node_exit(line: str) -> tuple[str, int] | None:
    """(the line to print, the node's status) for pdsh's report of a node that failed."""
    m = NODE_EXIT.match(line)
    if not m:
        return None
    host, rc = m["host"], int(m["rc"])
    if rc == SSH_UNREACHABLE:
        return (f"node {host}: ssh failed or its command exited with 255; check passwordless ssh "
                f"to {host} (`ssh {host} hostname`) and the lines above", rc)
    return f"node {host} ended with exit status {rc}", rc


class _Nodes:
    """deepy.py's side of a running pdsh launch: the pdsh process and the nodes' outcomes."""

    def __init__(self, launch: PdshLaunch, launch_id: str, env: dict[str, str],
                 merger: WarningMerger | None = None):
        self.launch, self.launch_id, self.env = launch, launch_id, _pdsh_env(env)
        self.merger = merger  # the workers' errors seen so far (said_why)
        self.first_failure = 0
        self.explained: dict[str, set[int]] = {}  # node -> statuses its workers' errors explain
        self.unexplained: set[str] = set()  # nodes with a death reported
        self.aborted = False
        self.senders: list[subprocess.Popen] = []

    def send(self, name: str) -> None:
        """`name` to every node launcher (asynchronously: a signal handler must not block)."""
        self.senders.append(subprocess.Popen(
            pdsh_argv(self.launch.hosts, signal_command(name, self.launch_id)), env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))

    def line(self, text: str) -> str | None:
        """Relay hook: pdsh's report of a node that failed, reworded (dropped for a node that
        stopped on a signal after saving, or whose failure its workers' errors explain); a node
        launcher's death line, dropped when the workers' error lines said why. The first
        failure stops the others."""
        death = DEATH.search(text)
        if death:
            status = (128 + signal.Signals[death["sig"]] if death["sig"]
                      else int(death["rc"]))
            # the first death is the cause; later ones follow
            self.first_failure = self.first_failure or status
            return self._death(death["node"] or "", death["ranks"], status, bool(death["rc"]))
        described = describe_node_exit(text)
        if described is None:
            return None
        line, status = described
        if not self.first_failure:
            self.first_failure = status
        node = NODE_EXIT.match(text)["host"]
        quiet = node not in self.unexplained and status in self.explained.get(node, ())
        return "" if status in PREEMPTED or quiet else line

    def _death(self, node: str, ranks: str, status: int, exited: bool) -> str | None:
        """None to print a node launcher's death line; "" when the ranks' errors explain it
        (they printed one and exited with a status, not on a signal)."""
        if exited and self.merger is not None and self.merger.said_why(parse_ranks(ranks)):
            # no flush: the error is held for the other nodes' ranks that meet it too
            self.explained.setdefault(node, set()).add(status)
            return ""
        self.unexplained.add(node)
        return None

    def finish_senders(self) -> None:
        for proc in self.senders:
            try:
                proc.wait(timeout=SIGNAL_MARGIN_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()


def run_pdsh(launch: PdshLaunch, worker_argv: list[str], exports: dict[str, str],
             env: dict[str, str], launch_id: str, redactor: Redactor,
             on_stop: str = "which stop") -> int:
    """Run the launch to its end; 0, the first failed node's status, or 128 + the signal that
    stopped deepy.py."""
    merger = WarningMerger(sys.stderr, range(launch.world_size))  # across the nodes
    nodes = _Nodes(launch, launch_id, env, merger)
    command = node_command(launch, launch_id, worker_argv, exports)
    proc = subprocess.Popen(pdsh_argv(launch.hosts, command), env=nodes.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    threads = [relay(proc.stdout, sys.stdout, redactor),
               relay(proc.stderr, sys.stderr, redactor, rewrite=nodes.line, merger=merger)]
    forward = lambda signum: nodes.send("INT" if signum == signal.SIGINT else "TERM")  # noqa: E731
    with DeepySignals(launch.grace_seconds, forward, on_stop=on_stop) as signals:
        while proc.poll() is None:
            if nodes.first_failure not in (0, *PREEMPTED) and not nodes.aborted \
                    and not signals.signum:
                nodes.aborted = True  # the others cannot go on without the failed node's ranks
                nodes.send("ABORT")
            if signals.signum and time.monotonic() > signals.deadline + SIGNAL_MARGIN_SECONDS:
                print(f"deepy.py: the nodes did not stop within signal_grace_seconds + "
                      f"{SIGNAL_MARGIN_SECONDS:g} s: killing every worker (SIGKILL)",
                      file=sys.stderr, flush=True)
                nodes.send("KILL")
                nodes.finish_senders()
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            time.sleep(POLL_SECONDS)
        drain(proc, threads, merger)  # with the handlers in place (local.run_local says why)
    nodes.finish_senders()
    kill_tagged(launch_id)  # this machine's share, when it is one of the nodes
    if signals.signum:
        return 128 + signals.signum
    return nodes.first_failure or proc.returncode


def _pdsh_env(env: dict[str, str]) -> dict[str, str]:
    """pdsh's environment: over ssh; untagged, so that only the node launchers and their
    workers carry the launch's tag (the command exports it)."""
    env = {k: v for k, v in env.items() if k != LAUNCH_ID_VAR}
    return {**env, "PDSH_RCMD_TYPE": env.get("PDSH_RCMD_TYPE", "ssh")}

