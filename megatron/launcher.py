"""Turn a resolved config into a launch plan, and run it: this machine's workers, or every node's.

Without a hostfile, with `no_ssh` (deepy.py once per node, with `node_rank`), or with a hostfile
of one host that DeepSpeed's runner would start here anyway, deepy.py starts this node's workers
itself and watches them (`megatron.launching.local`: one line per dead worker, the rest stopped,
signals passed on, no orphans). Without a hostfile the rendezvous is on a free port unless
`master_port` is set (a busy one set there is refused before anything starts). Otherwise
DeepSpeed's runner starts them, with the config's launcher (pdsh, openmpi, slurm, ...) and
include/exclude/num_nodes/num_gpus, on `master_port` or 29500, its output relayed without
secrets (`megatron.launching.runner`). mpirun and srun tell workers their rank in their own
variables (see `megatron.mpu.launch_env`) but not the master, so MASTER_PORT (and MASTER_ADDR
when `master_addr` is set) is exported to every worker; srun's workers otherwise take the first
host of the step's node list. srun reaches the nodes through SLURM, never ssh, so launcher slurm
skips DeepSpeed's ssh checks. Only the options that narrow the hostfile reach DeepSpeed's runner.
Workers get the resolved config on their command line (`--neox_args`), never YAML re-read from
disk; the values of `export_env_vars` never go on a command line (`megatron.launching.secrets`).

    plan = plan_launch(args, "train.py")
    status = run_plan(args, plan)        # one attempt: 0, a worker's status, or 128 + signal
"""

from __future__ import annotations

import dataclasses
import os
import random
import shlex
import socket
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from megatron.evaluation.hub import offline_env
from megatron.launching.local import LocalLaunch, local_launch, run_local
from megatron.launching.pdsh import (FAN_OUT, PdshLaunch, check_pdsh, check_ssh, deepspeed_env_files,
                                     first_host_address, node_command, node_exports, pdsh_argv,
                                     run_pdsh)
from megatron.launching.runner import run_runner
from megatron.launching.secrets import (ENV_FILE_VAR, STARTUP_VARS, Redactor, secret_values,
                                        write_env_file as write_secrets_file)
from megatron.launching.stopping import LAUNCH_ID_VAR, kill_tagged, new_launch_id, workers_on_stop
from megatron.monitoring.logger import get_logger, setup_logging
from megatron.neox_arguments.sections.launcher import MPI_LAUNCHERS, MULTI_NODE_MASTER_PORT

log = get_logger(__name__)

CONFIG_FLAG = "--neox_args"
# DeepSpeed's runners for these launchers pass workers no master address (srun's workers take
# the first host of their node list instead).
NO_MASTER_ADDR_LAUNCHERS = ("openmpi", "mvapich")


@dataclass
class LaunchPlan:
    """The command to run, its environment additions, and the world it will form.

    `local` is set when deepy.py starts this node's workers itself (`argv` is then one worker's
    command); otherwise `argv` runs DeepSpeed's runner. `secrets` are the exported variables
    that must reach the workers but never a command line or a log.
    """

    argv: list[str]
    env: dict[str, str]
    world_size: int
    master_port: int
    hosts: dict[str, list[int]] = field(default_factory=dict)
    local: LocalLaunch | None = None
    secrets: dict[str, str] = field(default_factory=dict)
    pdsh: PdshLaunch | None = None  # set when pdsh runs the node launchers (argv: one worker's)
    on_stop: str = "which stop"  # what the workers do on deepy.py's SIGTERM (workers_on_stop)


DLTS_HOSTFILE = "/job/hostfile"  # DeepSpeed's runner's default hostfile, and GPT-NeoX's


def with_default_hostfile(args, environ=os.environ):
    """`args` with `hostfile: null` taken as GPT-NeoX and DeepSpeed's runner take it: the file
    $DLTS_HOSTFILE names, else /job/hostfile, where that file exists (said in one line);
    otherwise this machine alone."""
    if args.launcher.hostfile:
        return args
    path = environ.get("DLTS_HOSTFILE") or DLTS_HOSTFILE
    if not os.path.isfile(path):
        if environ.get("DLTS_HOSTFILE"):
            log.warning("DLTS_HOSTFILE names %s, which is not a file: running on this machine "
                        "only, as DeepSpeed's runner does", path)
        return args
    where = "DLTS_HOSTFILE" if environ.get("DLTS_HOSTFILE") else "DeepSpeed's default hostfile"
    log.info("hostfile: %s (%s; hostfile is not set), as GPT-NeoX reads it", path, where)
    return args.replace(hostfile=path)


def read_hostfile(path: str) -> dict[str, int]:
    """{host: slots} from a hostfile of `host slots=N` lines; a clear error when unusable."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"hostfile {path} does not exist (config key 'hostfile'): create it "
                                "with one 'hostname slots=N' line per node, or remove the key to "
                                "run on this machine only")
    try:
        text = p.read_text()
    except OSError as err:
        raise FileNotFoundError(f"hostfile {path} cannot be read ({err.strerror}); "
                                "fix its permissions or point 'hostfile' elsewhere") from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("slots=") or not parts[1][6:].isdigit():
            raise ValueError(f"hostfile {path} line {number}: {raw.strip()!r} is not "
                             "'hostname slots=N'")
        if parts[0] in hosts:
            raise ValueError(f"hostfile {path} line {number}: host {parts[0]} is listed twice")
        hosts[parts[0]] = int(parts[1][6:])
    if not hosts:
        raise ValueError(f"hostfile {path} lists no hosts; add 'hostname slots=N' lines")
    return hosts


def active_hosts(hosts: dict[str, int], include: str | None, exclude: str | None,
                 num_nodes: int, num_gpus: int | None) -> dict[str, list[int]]:
    """Apply include/exclude and num_nodes/num_gpus as DeepSpeed's runner will."""
    from deepspeed.launcher.runner import apply_num_nodes_and_gpus, parse_inclusion_exclusion

    pool = {h: n for h, n in hosts.items()}
    active = parse_inclusion_exclusion(pool, include or "", exclude or "")
    return dict(apply_num_nodes_and_gpus(active, num_nodes if num_nodes else -1,
                                         num_gpus if num_gpus else -1))


def omp_threads(configured: int | None, procs_per_node: int) -> int:
    """Threads per worker: the configured value, else this machine's cores split evenly."""
    if configured:
        return configured
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // max(procs_per_node, 1))


def exported_env(names, environ=None) -> dict[str, str]:
    """A2: the listed variables that are set here, to be exported to every worker."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in names or () if name in environ}


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_ports() -> range:
    """The ports the kernel hands to a bind of port 0 (Linux's range; its default elsewhere)."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port that nothing on this machine uses now, outside the kernel's ephemeral range.

    A port taken from that range (a bind of port 0) is free only for the moment: a program
    started after the pick, such as mpirun's daemon opening its own listeners, can be handed
    the same port by the kernel, and a worker then connects to that program instead of the
    rendezvous and waits forever. The kernel never hands out ports outside the range."""
    ephemeral = ephemeral_ports()
    candidates = [p for p in range(10000, 65536) if p not in ephemeral]
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.choice(candidates)
        if not port_in_use(port):
            return port
    with socket.socket() as s:  # every port tried is busy: an ephemeral one, as before
        s.bind(("", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether the rank-0 rendezvous could not listen on `port` here (any address holds it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store does
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def local_master_port(configured: int | None) -> int:
    """The rendezvous port of a run on this machine: a free one unless `master_port` is set."""
    if configured is None:
        return free_port()
    if port_in_use(configured):
        raise ValueError(f"master_port {configured} is in use on this machine; set "
                         f"master_port={free_port()} or leave it unset to pick one")
    return configured


def plan_launch(args, script: str, python: str = sys.executable) -> LaunchPlan:
    """Build the launch command for `script` with the resolved config `args`."""
    return dataclasses.replace(_plan(args, script, python),
                               on_stop=workers_on_stop(args, script))


def _plan(args, script: str, python: str) -> LaunchPlan:
    la = args.launcher
    if la.hostfile:
        pool = read_hostfile(la.hostfile)
        hosts = active_hosts(pool, la.include, la.exclude, la.num_nodes, la.num_gpus)
        mpirun = _starts_with_mpirun(la, hosts)
        if mpirun:
            _check_mpirun_can_start(la, pool, hosts)
    else:
        if la.include or la.exclude:
            raise ValueError("include/exclude select hosts from a hostfile, but 'hostfile' is not set")
        if la.num_nodes not in (None, -1, 1):
            raise ValueError(f"num_nodes={la.num_nodes} needs a hostfile listing the nodes "
                             "(config key 'hostfile')")
        if la.deepspeed_slurm:  # srun starts the workers through DeepSpeed's runner
            raise ValueError("deepspeed_slurm needs a hostfile of the allocation's nodes (config "
                             "key 'hostfile', one 'hostname slots=N' line per node, e.g. from "
                             "scontrol show hostnames $SLURM_JOB_NODELIST), or remove it")
        hosts = {"localhost": list(range(la.num_gpus or 1))}
    if (la.comment or la.account) and not (la.hostfile and la.launcher == "slurm"):
        log.warning("comment and account are given to srun, which starts the workers with "
                    "launcher: slurm and a hostfile; this launch does not use them")
    world = sum(len(slots) for slots in hosts.values())
    args = args.with_world_size(world)  # validates degrees against the real world size
    procs_here = max(len(s) for s in hosts.values())
    exported = exported_env(la.export_env_vars)
    secrets = secret_values(exported)
    env = {k: v for k, v in exported.items() if k not in secrets}
    env.setdefault("OMP_NUM_THREADS", str(omp_threads(la.omp_num_threads, procs_here)))
    if la.omp_num_threads:
        env["OMP_NUM_THREADS"] = str(la.omp_num_threads)
    worker = [script, CONFIG_FLAG, args.encode()]
    if not la.hostfile:
        port = local_master_port(la.master_port)
        here = local_launch(hosts, 0, la.master_addr or "127.0.0.1", port)
        return LaunchPlan(argv=[python, "-u", *worker], env=env, world_size=world,
                          master_port=port, hosts=hosts, local=here, secrets=secrets)
    port = la.master_port or MULTI_NODE_MASTER_PORT
    if la.no_ssh or not (mpirun or la.deepspeed_slurm or len(hosts) > 1):
        here = _per_node_launch(la, hosts, port)
        return LaunchPlan(argv=[python, "-u", *worker], env=env, world_size=world,
                          master_port=port, hosts=hosts, local=here, secrets=secrets)
    if la.launcher == "pdsh" and not mpirun and not la.deepspeed_slurm:
        check_pdsh()
        nodes = PdshLaunch(hosts=hosts, master_addr=la.master_addr or "", master_port=port,
                           grace_seconds=la.signal_grace_seconds)
        return LaunchPlan(argv=worker, env=env, world_size=world, master_port=port, hosts=hosts,
                          secrets=secrets, pdsh=nodes)
    env["MASTER_PORT"] = str(port)
    if la.master_addr:
        env["MASTER_ADDR"] = la.master_addr
    # mpirun runs the whole hostfile, and DeepSpeed refuses a selection
    selection = [] if mpirun else _host_selection(la, pool, hosts)
    argv = _runner_launch(la, python, port, hosts, selection) + worker
    return LaunchPlan(argv=argv, env=env, world_size=world, master_port=port, hosts=hosts,
                      secrets=secrets)


def _per_node_launch(la, hosts: dict[str, list[int]], port: int) -> LocalLaunch:
    """This node's workers of a hostfile launch that DeepSpeed's runner would start here: one
    node with no_ssh (node_rank), or a hostfile of one host."""
    if not la.no_ssh:
        return local_launch(hosts, 0, la.master_addr or "127.0.0.1", port)
    if la.node_rank is None:
        raise ValueError("no_ssh launches one node at a time and needs node_rank "
                         "(this node's index in the hostfile)")
    if not la.master_addr:
        raise ValueError("no_ssh needs master_addr (the address of node 0) to be set")
    return local_launch(hosts, la.node_rank, la.master_addr, port)


def _starts_with_mpirun(la, hosts: dict[str, list[int]]) -> bool:
    """Whether DeepSpeed's runner starts the workers with the MPI launcher: for several hosts,
    or for one with deepspeed_mpi (--force_multi); never with no_ssh."""
    multi_node = la.deepspeed_mpi or la.deepspeed_slurm or len(hosts) > 1
    return la.launcher in MPI_LAUNCHERS and multi_node and not la.no_ssh


def _check_mpirun_can_start(la, pool: dict[str, int], hosts: dict[str, list[int]]) -> None:
    """Refuse what DeepSpeed's MPI runners would refuse or run wrongly, before anything starts."""
    if {h: len(s) for h, s in hosts.items()} != pool:
        raise ValueError(f"launcher '{la.launcher}' starts one process per slot of every host in "
                         f"the hostfile and cannot select hosts or slots: remove include/exclude/"
                         f"num_nodes/num_gpus, or write a hostfile with only the slots to use")
    if la.launcher in NO_MASTER_ADDR_LAUNCHERS and not la.master_addr:
        raise ValueError(f"launcher '{la.launcher}' does not tell workers where rank 0 runs: set "
                         "master_addr (the address of the hostfile's first host, reachable from "
                         "every node)")


def _runner_launch(la, python: str, port: int, hosts: dict[str, list[int]],
                   selection: list[str]) -> list[str]:
    argv = [python, "-u", "-m", "deepspeed.launcher.runner", f"--hostfile={la.hostfile}",
            f"--master_port={port}", f"--launcher={la.launcher}", "--no_local_rank"]
    if la.master_addr:
        argv.append(f"--master_addr={la.master_addr}")
    elif la.launcher == "slurm":
        # Without an address DeepSpeed's runner asks the first host over ssh (`hostname -I`),
        # which compute nodes of a SLURM cluster rarely allow; srun's workers never read it
        # (they take the first host of SLURM_STEP_NODELIST), so the first host's name does.
        argv.append(f"--master_addr={next(iter(hosts))}")
    if la.deepspeed_mpi or la.deepspeed_slurm:
        argv.append("--force_multi")  # GPT-NeoX's: even one host is started by mpirun / srun
    if la.no_ssh_check or la.launcher == "slurm":
        argv.append("--no_ssh_check")
    argv += selection
    if la.launcher == "slurm" and (la.comment or la.account):
        # DeepSpeed's runner splits launcher_args as a shell would: a value with spaces is
        # quoted so that srun gets it as one argument ("--comment=my run", not a program `run`)
        extra = " ".join(shlex.quote(f"--{key}={value}")
                         for key, value in (("comment", la.comment), ("account", la.account))
                         if value)
        argv.append(f"--launcher_args={extra}")
    return argv


def _host_selection(la, pool: dict[str, int], hosts: dict[str, list[int]]) -> list[str]:
    """The runner's flags that narrow the hostfile to `hosts`; none when it is used whole.

    num_nodes / num_gpus that select nothing are left out: DeepSpeed's slurm runner turns
    --num_gpus into srun's --gpus-per-node, a GPU request that a CPU partition refuses
    ("Invalid generic resource"), while the hostfile's slots already give srun its task count.
    """
    if la.include or la.exclude:
        return ([f"--include={la.include}"] if la.include else []) + (
            [f"--exclude={la.exclude}"] if la.exclude else [])
    argv = []
    if len(hosts) < len(pool):
        argv.append(f"--num_nodes={la.num_nodes}")
    if any(len(slots) < pool[host] for host, slots in hosts.items()):
        argv.append(f"--num_gpus={la.num_gpus}")
    return argv


def write_env_file(env: dict[str, str]) -> str:
    """For launches over ssh/pdsh/mpi: a private file of variables (no secrets among them) that
    DeepSpeed's runner exports to every node, on their command line."""
    fd, path = tempfile.mkstemp(prefix="neox_env_", text=True)
    with os.fdopen(fd, "w") as f:
        for key, value in env.items():
            f.write(f"{key}={value}\n")
    os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    return path


def worker_args(argv: list[str]):
    """The resolved config a worker was started with (`--neox_args <encoded>` on its command line)."""
    from megatron.neox_arguments import NeoXArgs

    if CONFIG_FLAG not in argv or argv.index(CONFIG_FLAG) + 1 >= len(argv):
        script = os.path.relpath(sys.argv[0])  # tools/ckpts/reshard.py, as deepy.py needs it
        raise ValueError(f"this script runs on workers started by the launcher and expects "
                         f"{CONFIG_FLAG}; start it as: python deepy.py {script} "
                         "<config.yml> [more.yml] [key=value ...]")
    args = NeoXArgs.decode(argv[argv.index(CONFIG_FLAG) + 1])
    setup_logging(args.logging.log_level)
    return args


def script_help(script: str) -> str:
    """`deepy.py <script> --help`: the script's own description (its module docstring, read
    without running it) and where the config keys it takes are listed."""
    import ast

    doc = ast.get_docstring(ast.parse(Path(script).read_text(encoding="utf-8"))) or ""
    return (f"{doc}\n\n" if doc else "") + (
        f"usage: python deepy.py {script} configs/a.yml [configs/b.yml] [key=value ...]\n"
        "Every config key, with its default and meaning: configs/README.md")


def launch(script: str, argv: list[str]) -> int:
    """Resolve the config named on the command line and run `script` on every worker."""
    from megatron.entry import split_command_line
    from megatron.neox_arguments import NeoXArgs
    from megatron.restart import run_with_restarts

    if script.endswith((".yml", ".yaml", ".json")):
        raise ValueError(f"{script} is a config file, but the first argument is the script to "
                         f"run: python deepy.py train.py {script} [more.yml] [key=value ...] "
                         "(or generate.py, eval.py)")
    if not Path(script).is_file():
        where = "" if os.path.isabs(script) else f" in {os.getcwd()}"
        raise FileNotFoundError(f"script {script} does not exist{where}; usage: python deepy.py "
                                "train.py configs/a.yml [configs/b.yml] [key=value ...], run from "
                                "the repository root")
    if any(a in ("-h", "--help") for a in argv):
        print(script_help(script))
        return 0
    files, overrides = split_command_line(argv)
    if not files:
        raise ValueError("no config file given; usage: python deepy.py train.py configs/a.yml "
                         "[configs/b.yml] [key=value ...]")
    args = NeoXArgs.from_ymls(files, overrides)
    setup_logging(args.logging.log_level)
    from megatron.neox_arguments.load import log_overrides

    log_overrides(args.overrides_log)
    args = with_default_hostfile(args)
    return run_with_restarts(args, script, lambda attempt_args: run_once(attempt_args, script))


def run_once(args, script: str) -> int:
    """Check, plan and run one launch of every worker; the launcher's exit status."""
    from megatron.preflight import preflight

    if Path(script).name == "train.py":
        from megatron.training.finished import finished_run

        done = finished_run(args)  # a finished run's command run again: no worker is started
        if done:
            print(done, flush=True)
            return 0
    plan = plan_launch(args, script)
    # checked at the world the plan starts (its data-parallel degree), on this machine's workers
    preflight(args.with_world_size(plan.world_size), script,
              workers_here=max(len(slots) for slots in plan.hosts.values()))
    tasks = args.eval.eval_tasks if Path(script).name in ("train.py", "eval.py") else None
    hub = offline_env(tasks, {**os.environ, **plan.env})
    return run_plan(args, dataclasses.replace(plan, env={**plan.env, **hub}))


def run_plan(args, plan: LaunchPlan) -> int:
    """One attempt at running `plan` to its end: 0, a worker's status, or 128 + the signal that
    stopped deepy.py (see megatron.launching.local). Nothing of the launch outlives it here."""
    la = args.launcher
    launch_id = new_launch_id()
    env = {**os.environ, **plan.env, LAUNCH_ID_VAR: launch_id}
    try:
        if plan.local is not None:
            here = plan.local
            log.info("launching %d worker(s) on %s (ranks %d-%d of %d), master %s:%d",
                     len(here.ranks), here.host, here.ranks[0], here.ranks[-1], plan.world_size,
                     here.master_addr, here.master_port)
            return run_local(plan.argv, {**env, **plan.secrets}, here, la.signal_grace_seconds,
                             launch_id, on_stop=plan.on_stop)
        if plan.pdsh is not None:
            return _run_through_pdsh(args, plan, env, launch_id)
        return _run_through_runner(args, plan, env, launch_id)
    finally:
        kill_tagged(launch_id)


def _split_worker_variables(plan: LaunchPlan) -> tuple[dict[str, str], dict[str, str]]:
    """(startup, carried): the `.deepspeed_env` variables a process needs before it starts
    (STARTUP_VARS: on the launch command), and the rest of them with the secrets after them
    (in the owner-only file), the same split and order for pdsh and DeepSpeed's runner."""
    ds_env = deepspeed_env_files()
    startup = {k: v for k, v in ds_env.items() if k.startswith(STARTUP_VARS)}
    return startup, {**{k: v for k, v in ds_env.items() if k not in startup}, **plan.secrets}


def _run_through_pdsh(args, plan: LaunchPlan, env: dict[str, str], launch_id: str) -> int:
    """pdsh starting the node launchers; the secrets and `.deepspeed_env`'s variables in an
    owner-only file that only its path reaches."""
    la = args.launcher
    env = {k: v for k, v in env.items() if k not in plan.secrets}
    nodes = plan.pdsh
    if not la.no_ssh_check:
        check_ssh(plan.hosts, env)
    if not nodes.master_addr:
        first = next(iter(plan.hosts))
        nodes = dataclasses.replace(nodes, master_addr=first_host_address(first, env))
        log.info("master address %s (hostname -I on %s; set master_addr to choose)",
                 nodes.master_addr, first)
    startup, carried = _split_worker_variables(plan)
    exports = {**node_exports(plan.env, env), **startup, LAUNCH_ID_VAR: launch_id}
    path = write_secrets_file(carried, la.env_file_dir) if carried else None
    if path:
        exports[ENV_FILE_VAR] = path
    try:
        encoded = plan.argv[plan.argv.index(CONFIG_FLAG) + 1]
        redactor = Redactor(carried, [encoded])
        log.info("launching %d worker(s) on %d node(s) with pdsh: pdsh -S -f %d -w %s python "
                 "-m megatron.launching.node %s; exported: %s", plan.world_size, len(plan.hosts),
                 FAN_OUT, ",".join(plan.hosts), plan.argv[0], ", ".join(exports))
        log.debug("pdsh command: %s", redactor.clean(" ".join(pdsh_argv(
            plan.hosts, node_command(nodes, launch_id, plan.argv, exports)))))
        return run_pdsh(nodes, plan.argv, exports, env, launch_id, redactor, plan.on_stop)
    finally:
        if path:
            Path(path).unlink(missing_ok=True)


def _run_through_runner(args, plan: LaunchPlan, env: dict[str, str], launch_id: str) -> int:
    """DeepSpeed's runner with the secrets in an owner-only file that only its path reaches."""
    la = args.launcher
    env = {k: v for k, v in env.items() if k not in plan.secrets}
    # DeepSpeed's runner reads only the file DS_ENV_FILE names, not the user's .deepspeed_env
    # files: their variables travel as under pdsh (_run_through_pdsh)
    startup, carried = _split_worker_variables(plan)
    exports = {**plan.env, **startup, LAUNCH_ID_VAR: launch_id}
    files = []
    try:
        if carried:
            env[ENV_FILE_VAR] = exports[ENV_FILE_VAR] = write_secrets_file(carried,
                                                                          la.env_file_dir)
            files.append(env[ENV_FILE_VAR])
        env["DS_ENV_FILE"] = write_env_file(exports)
        files.append(env["DS_ENV_FILE"])
        encoded = plan.argv[plan.argv.index(CONFIG_FLAG) + 1]
        log.info("launching %d worker(s) on %d node(s) with %s: %s", plan.world_size,
                 len(plan.hosts), la.launcher, " ".join(plan.argv).replace(encoded, "<config>"))
        return run_runner(plan.argv, env, la.signal_grace_seconds, launch_id,
                          Redactor(carried, [encoded]), plan.world_size,
                          through_mpirun=la.launcher in (*MPI_LAUNCHERS, "slurm"),
                          on_stop=plan.on_stop)
    finally:  # the secrets file: gone with the run
        for path in files:
            Path(path).unlink(missing_ok=True)
