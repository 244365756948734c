"""Launch plans built from configs: argv for DeepSpeed's launcher, hostfiles, env export (A2)."""

import os
import shutil
import socket
import sys

import pytest

from megatron.launcher import (CONFIG_FLAG, ephemeral_ports, exported_env, free_port,
                               plan_launch, port_in_use, read_hostfile, with_default_hostfile,
                               worker_args, write_env_file)
from megatron.neox_arguments import NeoXArgs
from tests.runs import ROOT

TINY = "configs/tiny.yml"


def args(**overrides):
    # a global batch that any process count divides: micro-batch 8, no accumulation
    overrides = {"train_batch_size": "null", "gradient_accumulation_steps": 1, **overrides}
    return NeoXArgs.from_ymls([TINY], [f"{k}={v}" for k, v in overrides.items()])


def flag(argv, name):
    return next(a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}="))


def test_single_machine_workers_are_started_by_deepy_without_ssh():
    plan = plan_launch(args(num_gpus=3, master_port=29777, omp_num_threads=2), "train.py",
                       python="py")
    assert plan.argv[:3] == ["py", "-u", "train.py"]  # one worker's command, no launcher
    assert plan.local.ranks == (0, 1, 2) and plan.local.device_ids == (0, 1, 2)
    assert plan.world_size == 3 and plan.local.nnodes == 1
    assert (plan.local.master_addr, plan.local.master_port) == ("127.0.0.1", 29777)
    assert plan.env["OMP_NUM_THREADS"] == "2"
    # workers get the resolved config itself, decodable to an equal object
    script_at = plan.argv.index("train.py")
    assert plan.argv[script_at + 1] == CONFIG_FLAG
    decoded = worker_args(plan.argv[script_at + 1:])
    assert decoded == args(num_gpus=3, master_port=29777, omp_num_threads=2).with_world_size(3)


def test_omp_threads_default_splits_the_cores():
    plan = plan_launch(args(num_gpus=2), "train.py")
    cores = len(os.sched_getaffinity(0))
    assert plan.env["OMP_NUM_THREADS"] == str(max(1, cores // 2))


def test_hostfile_launch_passes_launcher_and_filters(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nworker-0 slots=4\nworker-1 slots=4\nworker-2 slots=4\n")
    plan = plan_launch(args(hostfile=hostfile, include="worker-0@worker-1", num_gpus="null",
                            launcher="slurm", master_addr="10.0.0.1"), "train.py", python="py")
    assert plan.argv[:4] == ["py", "-u", "-m", "deepspeed.launcher.runner"]
    assert flag(plan.argv, "hostfile") == str(hostfile)
    assert flag(plan.argv, "launcher") == "slurm"
    assert flag(plan.argv, "include") == "worker-0@worker-1"
    assert flag(plan.argv, "master_addr") == "10.0.0.1"
    assert plan.world_size == 8 and list(plan.hosts) == ["worker-0", "worker-1"]
    # srun's and mpirun's workers learn the master from these, exported through the env file
    assert plan.env["MASTER_ADDR"] == "10.0.0.1" and plan.env["MASTER_PORT"] == "29500"
    assert "--force_multi" not in plan.argv
    assert "--no_ssh_check" in plan.argv  # srun reaches the nodes through SLURM, not ssh


def test_an_unset_hostfile_is_the_one_gpt_neox_and_deepspeeds_runner_read(tmp_path, monkeypatch,
                                                                         caplog):
    """hostfile: null means $DLTS_HOSTFILE, else /job/hostfile, where the file exists (GPT-NeoX
    sizes the world from it and DeepSpeed's runner launches it); else this machine alone."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("worker-0 slots=2\nworker-1 slots=2\n")
    plain = args(num_gpus="null", launcher="slurm", master_addr="10.0.0.1")
    resolved = with_default_hostfile(plain, {"DLTS_HOSTFILE": str(hostfile)})
    assert resolved.launcher.hostfile == str(hostfile)
    plan = plan_launch(resolved, "train.py", python="py")
    assert flag(plan.argv, "hostfile") == str(hostfile) and plan.world_size == 4
    assert f"hostfile: {hostfile} (DLTS_HOSTFILE; hostfile is not set)" in caplog.text

    assert with_default_hostfile(plain, {"DLTS_HOSTFILE": str(tmp_path / "gone")}) is plain
    assert f"DLTS_HOSTFILE names {tmp_path / 'gone'}, which is not a file" in caplog.text
    monkeypatch.setattr("megatron.launcher.DLTS_HOSTFILE", str(hostfile))  # /job/hostfile
    assert with_default_hostfile(plain, {}).launcher.hostfile == str(hostfile)
    monkeypatch.setattr("megatron.launcher.DLTS_HOSTFILE", str(tmp_path / "none"))
    assert with_default_hostfile(plain, {}) is plain
    given = args(hostfile=hostfile, num_gpus="null")
    assert with_default_hostfile(given, {"DLTS_HOSTFILE": "/elsewhere"}) is given


def test_slurm_launch_asks_nothing_over_ssh_and_no_gpus_the_hostfile_does_not_narrow(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    plan = plan_launch(args(hostfile=hostfile, launcher="slurm", deepspeed_slurm=True,
                            num_gpus=2), "train.py")
    # DeepSpeed's runner would ssh to node-a for `hostname -I` without an address; srun's
    # workers take the master from their node list, so none is exported to them
    assert flag(plan.argv, "master_addr") == "node-a" and "MASTER_ADDR" not in plan.env
    assert "--no_ssh_check" in plan.argv and "--force_multi" in plan.argv
    # num_gpus equal to the slots selects nothing: passed on, srun would ask for GPUs
    assert not [a for a in plan.argv if a.startswith(("--num_gpus", "--num_nodes"))]
    # a selection of one host without deepspeed_slurm is started here, as DeepSpeed's runner
    # would (it leaves srun out for a single host)
    plan = plan_launch(args(hostfile=hostfile, launcher="slurm", num_gpus=1, num_nodes=1),
                       "train.py")
    assert plan.local.ranks == (0,) and plan.world_size == 1 and list(plan.hosts) == ["node-a"]
    plan = plan_launch(args(hostfile=hostfile, launcher="slurm", num_gpus=1), "train.py")
    assert flag(plan.argv, "num_gpus") == "1" and plan.world_size == 2 and plan.local is None


def test_slurm_comment_and_account_reach_srun_as_one_argument_each(tmp_path):
    """DeepSpeed's runner builds the srun command: a comment with spaces and quotes is still
    one argument, not words srun would take for the program to run."""
    from deepspeed.launcher.multinode_runner import SlurmRunner
    from deepspeed.launcher.runner import parse_args

    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=2\nnode-b slots=2\n")
    plan = plan_launch(args(hostfile=hostfile, launcher="slurm", deepspeed_slurm=True,
                            comment="'nightly run, it''s long'", account="proj-42"),
                       "train.py")
    runner_args = parse_args(plan.argv[4:])
    slots = {"node-a": [0, 1], "node-b": [0, 1]}
    srun = SlurmRunner(runner_args, "e30=", slots).get_cmd({}, slots)
    assert srun[:5] == ["srun", "-n", "4", "--comment=nightly run, it's long",
                        "--account=proj-42"], srun


def test_deepspeed_slurm_needs_the_hostfile_when_launching_not_when_loading(tmp_path):
    loaded = args(launcher="slurm", deepspeed_slurm=True)  # as srun's workers decode it too
    with pytest.raises(ValueError, match="deepspeed_slurm needs a hostfile of the allocation's "
                                         "nodes \\(config key 'hostfile'"):
        plan_launch(loaded, "train.py")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=2\nn1 slots=2\n")
    plan = plan_launch(loaded.replace(hostfile=str(hostfile), num_gpus=None), "train.py")
    assert flag(plan.argv, "launcher") == "slurm" and "--force_multi" in plan.argv
    assert plan.world_size == 4


def test_mpi_launch_runs_the_whole_hostfile_on_every_host(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=2\nn1 slots=2\n")
    plan = plan_launch(args(hostfile=hostfile, launcher="openmpi", deepspeed_mpi=True, num_gpus=2,
                            no_ssh_check=True, master_addr="10.0.0.1"), "train.py")
    # GPT-NeoX's deepspeed_mpi: mpirun starts even a single host; DeepSpeed's openmpi runner
    # refuses any host or slot selection, so none is passed when the hostfile is used whole
    assert "--force_multi" in plan.argv and "--no_ssh_check" in plan.argv
    assert not [a for a in plan.argv if a.startswith(("--num_gpus", "--num_nodes", "--include"))]
    assert plan.world_size == 4
    with pytest.raises(ValueError, match="launcher 'openmpi' starts one process per slot of every "
                                         "host in the hostfile and cannot select hosts or slots"):
        plan_launch(args(hostfile=hostfile, launcher="openmpi", num_gpus=1,
                         master_addr="10.0.0.1"), "train.py")
    with pytest.raises(ValueError, match="launcher 'openmpi' does not tell workers where rank 0 "
                                         "runs: set master_addr"):
        plan_launch(args(hostfile=hostfile, launcher="openmpi", num_gpus="null"), "train.py")
    # one host without deepspeed_mpi: started here, as DeepSpeed's runner would, on 2 slots
    hostfile.write_text("n0 slots=4\n")
    plan = plan_launch(args(hostfile=hostfile, launcher="openmpi", num_gpus=2), "train.py")
    assert plan.local.ranks == (0, 1) and plan.world_size == 2


def test_unset_master_port_picks_a_free_one_here():
    with socket.socket() as busy:  # whoever holds GPT-NeoX's default port, a local run avoids it
        try:
            busy.bind(("127.0.0.1", 29500))
        except OSError:
            pass  # held by someone else already: just as good
        plan = plan_launch(args(num_gpus=2), "train.py")
        assert plan.master_port != 29500 and not port_in_use(plan.master_port)
        assert plan.local.master_port == plan.master_port
        # outside the kernel's ephemeral range: mpirun's daemon, started after the pick, once
        # got the same port for its own listener by binding port 0, and rank 0 waited forever
        assert plan.master_port not in ephemeral_ports()


def test_unset_master_port_is_29500_with_a_hostfile(tmp_path):
    """Every node must agree on the port: GPT-NeoX's, busy here or not."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=1\nn1 slots=1\n")
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 29500))
        except OSError:
            pass  # held by someone else already: just as good
        plan = plan_launch(args(hostfile=hostfile, num_gpus=1, launcher="slurm"), "train.py")
        assert flag(plan.argv, "master_port") == "29500" and plan.master_port == 29500
        if shutil.which("pdsh") is None:  # plan_launch refuses the pdsh launcher without it
            pytest.skip("pdsh is not installed (apt-get install pdsh): its plan is not checked")
        plan = plan_launch(args(hostfile=hostfile, num_gpus=1), "train.py")  # pdsh
        assert plan.master_port == 29500 and plan.pdsh.master_port == 29500


def test_a_busy_master_port_set_explicitly_is_refused_with_the_key_to_change():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        with pytest.raises(ValueError) as err:
            plan_launch(args(num_gpus=2, master_port=port), "train.py")
    message = str(err.value)
    assert message.startswith(f"master_port {port} is in use on this machine; set master_port=")
    assert message.endswith(" or leave it unset to pick one")
    suggested = int(message.split("master_port=")[1].split()[0])
    assert suggested != port


def test_hostfile_world_size_is_checked_against_parallel_degrees(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=3\n")
    with pytest.raises(ValueError, match=r"3"):
        plan_launch(args(hostfile=hostfile, num_gpus="null", pipe_parallel_size=2), "train.py")


def test_per_node_mode_needs_node_rank_and_master(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n0 slots=1\nn1 slots=1\n")
    with pytest.raises(ValueError, match="node_rank"):
        plan_launch(args(hostfile=hostfile, num_gpus=1, no_ssh=True, master_addr="127.0.0.1"), "t.py")
    with pytest.raises(ValueError, match=r"^no_ssh needs master_addr \(the address of node 0\)"):
        plan_launch(args(hostfile=hostfile, num_gpus=1, no_ssh=True, node_rank=1), "t.py")
    with pytest.raises(FileNotFoundError, match=r"^hostfile .*gone does not exist \(config key "
                       r"'hostfile'\): create it with one 'hostname slots=N' line per node"):
        plan_launch(args(hostfile=tmp_path / "gone", num_gpus=1), "t.py")
    plan = plan_launch(args(hostfile=hostfile, num_gpus=1, no_ssh=True, node_rank=1,
                            master_addr="127.0.0.1"), "t.py")
    # this node's worker only, started by deepy.py: global rank 1, node 1 of 2
    assert plan.local.ranks == (1,) and plan.world_size == 2
    assert (plan.local.host, plan.local.node_rank, plan.local.nnodes) == ("n1", 1, 2)


@pytest.mark.parametrize("content,message", [
    ("worker-0 4\n", "line 1.*'hostname slots=N'"),
    ("a slots=1\na slots=2\n", "listed twice"),
    ("# nothing\n", "lists no hosts"),
])
def test_bad_hostfiles_name_the_file_and_line(tmp_path, content, message):
    hostfile = tmp_path / "hosts"
    hostfile.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_hostfile(str(hostfile))


def test_missing_and_unreadable_hostfile(tmp_path):
    with pytest.raises(FileNotFoundError, match="hostfile .*/nope does not exist"):
        read_hostfile(str(tmp_path / "nope"))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.write_text("a slots=1\n")
        locked.chmod(0)
        with pytest.raises(FileNotFoundError, match="cannot be read"):
            read_hostfile(str(locked))


def test_listed_env_vars_are_exported_and_written_privately():
    env = exported_env(["WANDB_API_KEY", "HF_TOKEN", "UNSET_ONE"],
                       {"WANDB_API_KEY": "k", "HF_TOKEN": "t", "OTHER": "x"})
    assert env == {"WANDB_API_KEY": "k", "HF_TOKEN": "t"}
    path = write_env_file({"MASTER_PORT": "29500", "NEOX_ENV_FILE": "/shared/f.json"})
    try:
        assert open(path).read() == "MASTER_PORT=29500\nNEOX_ENV_FILE=/shared/f.json\n"
        assert os.stat(path).st_mode & 0o077 == 0  # owner-only
    finally:
        os.unlink(path)


def test_worker_without_config_says_how_to_start_it():
    with pytest.raises(ValueError, match="python deepy.py"):
        worker_args([])


def test_a_picked_port_is_never_one_the_kernel_hands_to_a_bind_of_port_zero():
    ranges = ephemeral_ports()
    handed = set()
    for _ in range(50):  # what later programs binding port 0 get
        with socket.socket() as s:
            s.bind(("", 0))
            handed.add(s.getsockname()[1])
    assert handed <= set(ranges)  # the range the picker reads is the kernel's
    picked = {free_port() for _ in range(50)}
    assert not picked & set(ranges) and not any(port_in_use(p) for p in picked)


def test_a_worker_script_started_alone_says_the_deepy_command_with_its_path(monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(ROOT / "tools/ckpts/reshard.py"), "configs/tiny.yml"])
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match=r"expects --neox_args; start it as: python deepy.py "
                                         r"tools/ckpts/reshard.py <config.yml>"):
        worker_args(sys.argv[1:])


@pytest.mark.parametrize("script, overrides, said", [
    ("train.py", {"save": "/tmp/ck"}, "which stop after the current step and save"),
    ("train.py", {"save": "null"},
     "which stop after the current step (no checkpoint: 'save' is not set)"),
    ("train.py", {"save": "/tmp/ck", "save_on_signal": "false"},
     "which stop after the current step without saving (save_on_signal is false)"),
    ("eval.py", {"save": "/tmp/ck"}, "which stop at once"),
    ("eval.py", {"eval_cache_dir": "/tmp/scores"}, "which stop at once; what they scored "
     "stays in eval_cache_dir, and the same command run again scores only the rest"),
    ("generate.py", {"text_gen_type": "unconditional"},
     "which stop after the current batch and write the samples done so far"),
    ("generate.py", {"text_gen_type": "interactive"}, "which stop at once"),
])
def test_the_plan_says_what_the_workers_do_on_a_signal_as_the_script_and_config_decide(
        script, overrides, said):
    """deepy.py's line on SIGTERM / SIGINT promises a save only where the workers make one."""
    assert plan_launch(args(**overrides), script).on_stop == said


def test_comment_and_account_without_srun_are_said_to_be_unused(caplog):
    plan_launch(args(num_gpus=1, comment="nightly", account="lab"), "train.py")
    assert ("comment and account are given to srun, which starts the workers with launcher: "
            "slurm and a hostfile; this launch does not use them") in caplog.text
