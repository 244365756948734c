"""One node's share of a launch over pdsh (megatron.launching.pdsh): pdsh runs this module on
every node of the hostfile; it starts and watches that node's workers exactly as deepy.py does
for a launch on one machine (megatron.launching.local), and takes deepy.py's signals.

    python -u -m megatron.launching.node --node-rank=N --spec=SPEC -- train.py --neox_args ...
    python -m megatron.launching.node --signal=TERM --launch-id=ID --node-rank=N

The first form is the node launcher. SPEC (base64 JSON, `encode_spec`) holds the hosts with
their slots in hostfile order, the master address and port, `signal_grace_seconds` and the
launch id. Its workers are tagged with the node's own tag (stopping.node_tag), so what it sweeps
when it ends is this node's workers only, even where several "nodes" share a machine.

The second form is how deepy.py's signals cross to the nodes: run there by pdsh, it finds this
machine's node launcher of that launch and node rank (by the NEOX_LAUNCH_ID in its environment
and its command line) and sends it SIGTERM or SIGINT (stop after the step and save, within the
grace time), ABORT (SIGUSR1: a worker on another node failed; stop the workers here as after a
local death) or KILL (SIGKILL its workers and itself). It prints nothing when none is running.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import socket
import sys

from megatron.launching.local import LocalLaunch, name_cpu_accelerator, run_local
from megatron.launching.secrets import load_env_file
from megatron.launching.stopping import LAUNCH_ID_VAR, kill_tagged, node_tag, tagged
from megatron.monitoring.logger import get_logger, setup_logging

log = get_logger("megatron.launching.node")  # also when run as __main__

MODULE = "megatron.launching.node"
SIGNALS = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "ABORT": signal.SIGUSR1,
           "KILL": signal.SIGKILL}


def encode_spec(hosts: dict[str, list[int]], master_addr: str, master_port: int,
                grace_seconds: float, launch_id: str) -> str:
    spec = {"hosts": [[h, list(s)] for h, s in hosts.items()], "master_addr": master_addr,
            "master_port": master_port, "grace": grace_seconds, "launch_id": launch_id}
    return base64.urlsafe_b64encode(json.dumps(spec).encode()).decode()


def decode_spec(text: str) -> dict:
    return json.loads(base64.urlsafe_b64decode(text.encode()))


def node_launch(spec: dict, node_rank: int) -> LocalLaunch:
    """This node's workers: global ranks numbered in hostfile order, as DeepSpeed does."""
    hosts = [(h, slots) for h, slots in spec["hosts"]]
    if not 0 <= node_rank < len(hosts):
        raise ValueError(f"node rank {node_rank} is not in [0, {len(hosts)})")
    first = sum(len(slots) for _, slots in hosts[:node_rank])
    host, slots = hosts[node_rank]
    return LocalLaunch(host=host, node_rank=node_rank, nnodes=len(hosts),
                       world_size=sum(len(s) for _, s in hosts),
                       ranks=tuple(range(first, first + len(slots))), device_ids=tuple(slots),
                       master_addr=spec["master_addr"], master_port=int(spec["master_port"]))


def run_node(spec: dict, node_rank: int, worker_argv: list[str]) -> int:
    """Start and watch this node's workers; the node's status (see megatron.launching.local)."""
    launch = node_launch(spec, node_rank)
    tag = node_tag(spec["launch_id"], node_rank)
    log.info("node %d of %d (%s): launching %d worker(s), ranks %d-%d of %d, master %s:%d",
             node_rank, launch.nnodes, launch.host, len(launch.ranks), launch.ranks[0],
             launch.ranks[-1], launch.world_size, launch.master_addr, launch.master_port)
    # an ABORT arriving before or after the watch (another node failed meanwhile) must not
    # end this launcher with SIGUSR1's default action: its own status is the one to report
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        return run_local([sys.executable, "-u", *worker_argv], dict(os.environ), launch,
                         float(spec["grace"]), tag, abort_signal=signal.SIGUSR1)
    finally:
        kill_tagged(tag)


def node_launchers(launch_id: str, node_rank: int) -> list:
    """This machine's node launcher of `launch_id` for `node_rank` (none once it has ended)."""
    found = []
    for proc in tagged(launch_id):
        try:
            argv = proc.cmdline()
        except Exception:  # it ended meanwhile
            continue
        module = argv.index("-m") + 1 if "-m" in argv else 0
        if (proc.environ().get(LAUNCH_ID_VAR) == launch_id and module and argv[module] == MODULE
                and f"--node-rank={node_rank}" in argv
                and not any(a.startswith("--signal") for a in argv)):
            found.append(proc)
    return found


def signal_node(name: str, launch_id: str, node_rank: int) -> int:
    """Send `name` (TERM, INT, ABORT, KILL) to the node launcher; KILL also ends its workers."""
    for proc in node_launchers(launch_id, node_rank):
        try:
            proc.send_signal(SIGNALS[name])
        except Exception:
            pass
    if name == "KILL":
        kill_tagged(node_tag(launch_id, node_rank))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--spec")
    parser.add_argument("--signal", choices=sorted(SIGNALS))
    parser.add_argument("--launch-id")
    parser.add_argument("worker", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.signal:
        return signal_node(args.signal, args.launch_id, args.node_rank)
    worker = args.worker[1:] if args.worker[:1] == ["--"] else args.worker
    if not args.spec or not worker:
        parser.error("a node launch needs --spec and the worker's command after --")
    setup_logging()
    try:  # the workers' environment: the secrets file, the accelerator's name
        load_env_file(os.environ)
        name_cpu_accelerator(os.environ)
        return run_node(decode_spec(args.spec), args.node_rank, worker)
    except (ValueError, RuntimeError, OSError) as err:
        print(f"error (node {args.node_rank} on {socket.gethostname()}): {err}", file=sys.stderr,
              flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
