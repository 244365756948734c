"""deepy.py's one connection to the Hugging Face Hub before lm-eval's workers start: where none
opens, the workers run in the Hub's offline mode and a missing dataset is one line from deepy.py
before they start (test_task_data.py), not half a minute of retries in every worker."""

from __future__ import annotations

import logging
import socket

import pytest

from megatron.evaluation.hub import (OFFLINE_VARS, fetch_failure, offline_env, offline_reason,
                                     route, unreachable)
from tests.runs import ROOT, deepy, explain, free_port

TASKS = ROOT / "tests/evaluation/tasks"


def closed_port() -> int:
    """A local port nothing listens on (connections to it are refused at once)."""
    return free_port()


def test_a_connection_is_refused_unresolvable_or_made():
    assert "Connection refused" in unreachable("127.0.0.1", closed_port())
    assert unreachable("hub.invalid", 443).startswith("cannot resolve hub.invalid: ")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable("127.0.0.1", server.getsockname()[1]) is None


def test_the_first_connection_goes_to_the_proxy_unless_no_proxy_names_the_hub():
    hub = "https://huggingface.co"
    assert route(hub, {}) == ("huggingface.co", 443, hub)
    mirror = "http://mirror.local:8080/"
    assert route(mirror, {}) == ("mirror.local", 8080, mirror)
    proxied = {"HTTPS_PROXY": "http://proxy.corp:3128"}
    assert route(hub, proxied) == ("proxy.corp", 3128, f"the proxy proxy.corp:3128 for {hub}")
    assert route(hub, {**proxied, "NO_PROXY": "localhost,.huggingface.co"})[0] == \
        "huggingface.co"


def test_the_workers_go_offline_only_when_tasks_run_the_user_chose_nothing_and_no_connection_opens(
        caplog, tmp_path):
    unreachable_hub = {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    with caplog.at_level(logging.WARNING, logger="megatron"):
        assert offline_env(["lambada_openai"], unreachable_hub) == {v: "1" for v in OFFLINE_VARS}
    (record,) = caplog.records
    assert record.getMessage().startswith(
        f"the Hugging Face Hub cannot be reached from here ({unreachable_hub['HF_ENDPOINT']}: "
        "127.0.0.1:")
    assert "set HF_HUB_OFFLINE=0 to have them try the Hub anyway" in record.getMessage()
    caplog.clear()
    assert offline_env([], unreachable_hub) == {}  # no lm-eval tasks
    local = [str(TASKS / "tiny_mc.yaml"), str(TASKS)]  # task files reading local data only
    assert offline_env(local, unreachable_hub) == {}
    assert offline_env(local + ["lambada_openai"], unreachable_hub) != {}
    remote = tmp_path / "remote_mc.yaml"  # a local task file whose data is on the network
    remote.write_text((TASKS / "tiny_mc.yaml").read_text().replace(
        "tests/evaluation/tasks/tiny_mc.jsonl", "https://example.org/tiny_mc.jsonl"))
    assert offline_env([str(remote)], unreachable_hub) != {}
    caplog.clear()
    assert offline_env(["lambada_openai"], {**unreachable_hub, "HF_HUB_OFFLINE": "0"}) == {}
    assert offline_env(["lambada_openai"], {**unreachable_hub, "HF_DATASETS_OFFLINE": "1"}) == {}
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        reachable = {"HF_ENDPOINT": f"http://127.0.0.1:{server.getsockname()[1]}"}
        assert offline_env(["lambada_openai"], reachable) == {}
    assert caplog.records == []


def test_a_missing_dataset_is_explained_for_the_mode_the_workers_run_in():
    err = ConnectionError("Couldn't reach 'EleutherAI/lambada_openai' on the Hub")
    offline = fetch_failure(err, {"HF_HUB_OFFLINE": "1"})
    assert offline.startswith("a task's dataset is not in the local cache (Couldn't reach "
                              "'EleutherAI/lambada_openai' on the Hub), and the workers run in "
                              "the Hugging Face Hub's offline mode (HF_HUB_OFFLINE=1): fill the "
                              "cache (")
    online = fetch_failure(err, {"HF_ENDPOINT": "http://mirror.local"})
    assert "registry tasks download from the Hugging Face Hub (http://mirror.local) on first " \
           "use: check the network" in online


def test_an_eval_where_the_hub_cannot_be_reached_fails_in_one_line_before_any_worker(trained,
                                                                                    tmp_path):
    """A registry task on a machine without the Hub (here: an endpoint that refuses every
    connection) and with an empty cache: deepy.py's one error line, naming the task, its
    dataset, the cache and why the workers would run offline, and no worker; neither the Hub
    client's `Retrying in 1s [Retry 1/5]` lines (about 30 s of them) nor a model load come."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf/datasets")}
    for var in OFFLINE_VARS:
        env[var] = ""
    proc = deepy("eval.py", str(ROOT / "configs/tiny.yml"), *trained["overrides"],
                 "eval_tasks=[lambada_openai]", f"log_dir={tmp_path / 'logs'}",
                 f"master_port={free_port()}", env=env)
    assert proc.returncode == 1, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: lm-eval task lambada_openai reads EleutherAI/lambada_openai (config default) "
        f"from the Hugging Face Hub: not in the local datasets cache ({tmp_path / 'hf/datasets'}"
        "), and the workers run offline (the Hugging Face Hub cannot be reached from here: "
        f"{endpoint}: 127.0.0.1:"), explain(proc)
    assert "launching" not in proc.stderr and "[rank" not in proc.stderr, explain(proc)
    assert "Retry" not in proc.stderr and "Traceback" not in proc.stderr, explain(proc)


def test_deepy_s_check_and_the_launch_share_one_connection_attempt():
    """preflight asks whether the workers will run offline, then the launch whether to start
    them so: one connection to the Hub answers both."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        reachable = {"HF_ENDPOINT": f"http://127.0.0.1:{server.getsockname()[1]}"}
        assert offline_reason(reachable) is None
        assert offline_env(["lambada_openai"], reachable) == {}
        server.accept()[0].close()
        with pytest.raises(socket.timeout):
            server.accept()  # no second connection
    assert offline_reason({"HF_HUB_OFFLINE": "1"}) == "HF_HUB_OFFLINE=1"
    assert offline_reason({"HF_HUB_OFFLINE": "0"}) is None  # the user chose the Hub


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_the_user_s_offline_setting_is_read_as_the_hub_client_reads_it(value):
    assert "offline mode" in fetch_failure(ConnectionError("x"), {"HF_DATASETS_OFFLINE": value})
