"""Command lines as users type them: config files, key=value, and GPT-NeoX's --key forms."""

import pytest

from megatron.entry import run_entry, split_command_line
from megatron.monitoring.errors import describe_error


def test_files_and_overrides_in_any_order():
    assert split_command_line(["a.yml", "train_iters=5", "b.yaml", "seed=3"]) == (
        ["a.yml", "b.yaml"], ["train_iters=5", "seed=3"])


def test_dash_dash_forms_including_lists():
    files, overrides = split_command_line(
        ["c.yml", "--eval_tasks", "lambada_openai", "hellaswag", "--seed", "7", "--lr=0.1", "x=1"])
    assert files == ["c.yml"]
    assert overrides == ["eval_tasks=[lambada_openai, hellaswag]", "seed=7", "lr=0.1", "x=1"]


def test_option_without_value_says_how_to_write_it():
    with pytest.raises(ValueError, match="--seed has no value; write seed=VALUE"):
        split_command_line(["c.yml", "--seed"])


def test_gpt_neox_deepy_forms_conf_dir_suffix_and_short_options():
    """`python deepy.py train.py -d configs 125M local_setup` as GPT-NeoX's README writes it."""
    assert split_command_line(["-d", "configs", "125M", "local_setup", "train_iters=5"]) == (
        ["configs/125M.yml", "configs/local_setup.yml"], ["train_iters=5"])
    assert split_command_line(["--conf_dir=c", "x.json", "y.yaml"]) == (["c/x.json", "c/y.yaml"], [])
    files, overrides = split_command_line(["configs/tiny.yml", "-H", "hosts", "-i", "in.txt",
                                           "-o", "out.txt", "--min_lr", "-1"])
    assert files == ["configs/tiny.yml"]
    assert overrides == ["hostfile=hosts", "sample_input_file=in.txt",
                         "sample_output_file=out.txt", "min_lr=-1"]
    with pytest.raises(ValueError, match="-d has no value; write conf_dir=VALUE"):
        split_command_line(["a.yml", "-d"])
    with pytest.raises(ValueError, match=r"--autotuning \(DeepSpeed's autotuner\) is not supported"):
        split_command_line(["a.yml", "--autotuning", "tune"])


def test_deepy_runs_gpt_neox_style_command_lines(tmp_path):
    """The config named as GPT-NeoX names it resolves to the same config as the full path."""
    from megatron.neox_arguments import NeoXArgs
    from tests.runs import ROOT

    files, overrides = split_command_line(["-d", str(ROOT / "configs"), "tiny", "num_gpus=1"])
    assert NeoXArgs.from_ymls(files, overrides) == NeoXArgs.from_ymls(
        [ROOT / "configs" / "tiny.yml"], ["num_gpus=1"])


def test_an_override_whose_value_is_a_json_or_yaml_path_stays_an_override():
    assert split_command_line(["a.yml", "vocab_file=/data/tokenizer.json",
                               "hostfile=/etc/hosts.yml", "optimizer.params.lr=0.1"]) == (
        ["a.yml"], ["vocab_file=/data/tokenizer.json", "hostfile=/etc/hosts.yml",
                    "optimizer.params.lr=0.1"])


def test_a_lost_connection_to_another_rank_is_said_in_one_short_line():
    gloo = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
                        "Read error [10.1.2.3]:59078: Connection reset by peer. This is typically "
                        "caused by a remote worker hanging or bugs in the application. Check the "
                        "logs of the remote worker before reporting an error. GLHF!")
    assert describe_error(gloo) == (
        "lost the connection to another rank (Read error [10.1.2.3]:59078: Connection reset by "
        "peer): that rank stopped or died; its own lines above say why")
    assert describe_error(ValueError("seq_length must be > 0")) == "seq_length must be > 0"


def test_a_timed_out_collective_is_said_in_one_line_with_the_seconds_it_waited():
    from megatron.monitoring.errors import collective_timeout

    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
                        "Timed out waiting 120000ms for recv operation to complete")
    nccl = RuntimeError("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL("
                        "SeqNum=812, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000)"
                        " ran for 600041 milliseconds before timing out.")
    assert collective_timeout(gloo) == 120.0 and collective_timeout(nccl) == 600.0
    assert collective_timeout(ValueError("Timed out after 3 tries")) is None
    assert describe_error(gloo).startswith(
        "a collective timed out: this rank waited 120 s (distributed_timeout_minutes) for "
        "another rank that never joined it; ")
    assert "raise distributed_timeout_minutes" in describe_error(nccl)


def test_a_user_error_is_one_line_and_neox_traceback_shows_where_it_came_from(capsys,
                                                                              monkeypatch):
    def main():
        raise FileNotFoundError("data file d.bin does not exist")

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("NEOX_TRACEBACK", raising=False)
    assert run_entry(main) == 1
    assert capsys.readouterr().err.splitlines()[-1] == "error: data file d.bin does not exist"
    monkeypatch.setenv("NEOX_TRACEBACK", "1")  # docs/checks.md: the traceback, for a report
    assert run_entry(main) == 1  # and the same exit, not the interpreter's teardown
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.splitlines()[-1] == "FileNotFoundError: data file d.bin does not exist"


def test_a_missing_optional_package_is_one_line_saying_what_to_install(capsys, monkeypatch):
    """SPMTokenizer without sentencepiece (a feature's package, not a bug): no traceback."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("NEOX_TRACEBACK", raising=False)

    def main():
        raise ImportError("SPMTokenizer needs the sentencepiece package: pip install sentencepiece")

    assert run_entry(main) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == ("error: SPMTokenizer needs the sentencepiece package: pip "
                                    "install sentencepiece") and "Traceback" not in err


def test_command_lines_typed_the_wrong_way_say_the_right_one():
    with pytest.raises(ValueError, match=r"spaces around '=' on the command line: write the "
                                         r"override as one word, train_iters=3"):
        split_command_line(["configs/tiny.yml", "train_iters", "=", "3"])
    with pytest.raises(ValueError, match=r"write the override as one word, seed=7"):
        split_command_line(["configs/tiny.yml", "seed", "=7"])
    with pytest.raises(ValueError, match=r"^train.py is a script among the config files: the "
                                         r"script comes first, python deepy.py train.py"):
        split_command_line(["configs/tiny.yml", "train.py"])


def test_a_config_file_where_the_script_goes_is_named_as_such():
    from megatron.launcher import launch

    with pytest.raises(ValueError, match=r"^configs/tiny.yml is a config file, but the first "
                                         r"argument is the script to run: python deepy.py "
                                         r"train.py configs/tiny.yml"):
        launch("configs/tiny.yml", [])


@pytest.mark.parametrize("status", [0, 3])
def test_exit_process_returns_with_a_thread_pool_alive(status, tmp_path):
    """A finished script exits with its status while a ThreadPoolExecutor's idle worker threads
    (torch.compile leaves some) are alive, running atexit handlers as the interpreter does."""
    import subprocess
    import sys

    from tests.runs import ROOT

    marker = tmp_path / "atexit"
    script = (
        "import atexit, pathlib\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from megatron.entry import exit_process\n"
        "pool = ThreadPoolExecutor(2)\n"
        "assert pool.submit(sum, [1, 2]).result() == 3\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'ran')\n"
        f"exit_process({status})\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == status, proc.stderr
    assert marker.read_text() == "ran"
