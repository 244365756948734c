"""wandb_host: the credentials looked up for it, and the server wandb is started with (offline,
see tests/conftest.py: no network is contacted). Comet's own offline settings, and a tracker
package that is missing (a run with Comet: tests/e2e/test_comet.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from megatron.monitoring.trackers import (DEFAULT_WANDB_HOST, MetricsTracker, wandb_enabled,
                                          tracker_tag, wandb_has_credentials, wandb_server)
from megatron.neox_arguments import NeoXArgs
from megatron.preflight import preflight
from tests.logs import Warnings
from tests.monitoring.comet_archive import read_comet_archive
from tests.runs import ROOT

HOST = "https://wandb.example.test"


@pytest.fixture
def netrc(tmp_path, monkeypatch):
    """A .netrc (through $NETRC) with a wandb key for HOST and for a server on port 8080."""
    path = tmp_path / "netrc"
    path.write_text("machine wandb.example.test\n  login user\n  password key1\n"
                    "machine local.example.test:8080 login user password key2\n")
    path.chmod(0o600)
    monkeypatch.setenv("NETRC", str(path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    return path


@pytest.fixture
def warnings():
    logger = logging.getLogger("megatron.monitoring.trackers")
    handler = Warnings()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def test_credentials_are_looked_up_for_the_configured_host(netrc, monkeypatch):
    assert wandb_has_credentials(HOST)
    assert wandb_has_credentials(HOST + "/")
    assert wandb_has_credentials("http://local.example.test:8080")
    assert not wandb_has_credentials(DEFAULT_WANDB_HOST)  # no api.wandb.ai entry
    assert not wandb_has_credentials("http://local.example.test")  # another port
    # use_wandb null follows the credentials of the configured host
    assert wandb_enabled(None, HOST) and not wandb_enabled(None, DEFAULT_WANDB_HOST)
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_has_credentials(DEFAULT_WANDB_HOST)


def test_an_entry_without_a_key_or_an_unreadable_netrc_is_no_credential(netrc, warnings):
    netrc.write_text("machine wandb.example.test login user\n")
    assert not wandb_has_credentials(HOST)
    netrc.write_text("wandb.example.test key1\n")  # not netrc syntax
    assert not wandb_has_credentials(HOST)
    assert any("cannot read" in m and str(netrc) in m for m in warnings)


def test_wandb_base_url_is_kept_when_wandb_host_is_left_at_its_default(monkeypatch):
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    assert wandb_server(DEFAULT_WANDB_HOST) == DEFAULT_WANDB_HOST
    assert wandb_server(HOST) == HOST
    monkeypatch.setenv("WANDB_BASE_URL", "https://env.example.test")
    assert wandb_server(DEFAULT_WANDB_HOST) == "https://env.example.test"
    assert wandb_server(HOST) == HOST


def _tracker(tmp_path, host: str) -> MetricsTracker:
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"],
                              {"use_wandb": True, "wandb_host": host,
                               "log_dir": str(tmp_path / "logs")})
    return MetricsTracker.from_args(args, enabled=True)


def test_wandb_runs_against_the_configured_host(tmp_path, netrc, monkeypatch, warnings):
    monkeypatch.setenv("WANDB_MODE", "offline")
    tracker = _tracker(tmp_path, HOST)
    try:
        assert tracker._wandb.settings.base_url == HOST
        assert tracker._wandb.settings.mode == "offline"
        tracker.log({"lm_loss": 1.0, "gradient_norms/0.word_embeddings.weight": 0.5}, step=1)
    finally:
        tracker.close()
    assert not warnings
    # a WANDB_BASE_URL that disagrees with a configured wandb_host is overridden, and said so
    monkeypatch.setenv("WANDB_BASE_URL", "https://env.example.test")
    tracker = _tracker(tmp_path, HOST)
    try:
        assert tracker._wandb.settings.base_url == HOST
    finally:
        tracker.close()
    assert warnings == [f"WANDB_BASE_URL=https://env.example.test is ignored: wandb_host is set "
                        f"to {HOST}"]


def test_wandb_without_credentials_logs_offline_and_says_how_to_sync(tmp_path, netrc,
                                                                     monkeypatch, warnings):
    """A2: use_wandb on, but no key, no .netrc entry for the host and WANDB_MODE unset on the
    worker: the run logs offline (nothing hangs on a login) and the warning says so."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracker = _tracker(tmp_path, DEFAULT_WANDB_HOST)  # the .netrc has no api.wandb.ai entry
    try:
        assert tracker._wandb.settings.mode == "offline"
        tracker.log({"lm_loss": 1.0}, step=1)
    finally:
        tracker.close()
    assert warnings == ["use_wandb is on but no wandb credentials for https://api.wandb.ai "
                        "reached this worker (WANDB_API_KEY unset, no ~/.netrc entry for "
                        "api.wandb.ai): logging offline; sync later with `wandb sync`"]


@pytest.fixture
def no_comet_key(tmp_path, monkeypatch):
    """No Comet API key anywhere: none in the environment, a HOME without ~/.comet.config."""
    for name in ("COMET_API_KEY", "COMET_START_ONLINE", "COMET_OFFLINE_DIRECTORY", "COMET_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "1")  # as the tracker sets them
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")


def test_comet_own_offline_settings_are_kept(tmp_path, no_comet_key, monkeypatch, warnings):
    # COMET_START_ONLINE=false asks for offline: no warning; COMET_OFFLINE_DIRECTORY wins over
    # log_dir/comet
    monkeypatch.setenv("COMET_START_ONLINE", "false")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "archives"))
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"],
                              {"use_comet": True, "comet_project": "p",
                               "log_dir": str(tmp_path / "logs")})
    tracker = MetricsTracker.from_args(args, enabled=True)
    try:
        tracker.log({"lm_loss": 2.5, "note": "not a number"}, step=3)
    finally:
        tracker.close()
    assert not warnings
    assert not (tmp_path / "logs" / "comet").exists()
    archive = read_comet_archive(tmp_path / "archives")
    assert archive.experiment["project_name"] == "p" and archive.metrics["train/lm_loss"] == {3: 2.5}
    assert "note" not in archive.metrics


def test_a_missing_tracker_package_is_refused_before_workers_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "comet_ml", None)  # import fails, find_spec finds nothing
    args = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], {"use_comet": True})
    message = ("use_comet is on but comet_ml is not installed: pip install -r "
               "requirements/requirements-comet.txt, or set use_comet: false")
    for script in ("train.py", "eval.py"):
        with pytest.raises(RuntimeError) as err:
            preflight(args, script)
        assert str(err.value) == message
    with pytest.raises(RuntimeError) as err:  # a worker started without deepy.py says the same
        MetricsTracker.from_args(args, enabled=True)
    assert str(err.value) == message
    off = NeoXArgs.from_ymls([ROOT / "configs" / "tiny.yml"], {"use_comet": False})
    with pytest.raises(ValueError, match="eval.py needs eval_tasks"):
        preflight(off, "eval.py")  # past the trackers, to eval.py's own settings
    assert MetricsTracker.from_args(off, enabled=True)._comet is None


def test_trackers_get_gpt_neox_tags_in_its_units():
    assert tracker_tag("lm_loss", 2.5) == ("train/lm_loss", 2.5)
    assert tracker_tag("val_ppl", 12.0) == ("validation/lm_loss_ppl", 12.0)
    assert tracker_tag("test_loss", 3.0) == ("test/lm_loss", 3.0)
    assert tracker_tag("iteration_time_ms", 250.0) == ("runtime/iteration_time", 0.25)
    assert tracker_tag("model_tflops_per_gpu", 2.0) == ("runtime/flops_per_sec_per_gpu", 2e12)
    assert tracker_tag("gradient_norms/0.word_embeddings.weight", 1.0) == \
        ("gradient_norms/0.word_embeddings.weight", 1.0)
    assert tracker_tag("something_new", 1.0) == ("train/something_new", 1.0)


def test_training_sets_aside_metrics_records_it_does_not_continue(tmp_path, caplog):
    """metrics.jsonl of a log_dir that holds an earlier run, or steps past the checkpoint a run
    resumes from: the file as it was is kept beside, and the new records continue only what
    the run continues; eval.py (no start iteration) appends as before."""
    import json

    path = tmp_path / "metrics.jsonl"
    old = [{"iteration": i, "lm_loss": 9.0 - i} for i in (10, 20, 30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in old) + '{"iteration": 3')  # cut line

    def records(p):
        return [json.loads(line) for line in p.read_text().splitlines()]

    # resumed from iteration 20: the record of 30 (redone now) moves aside with the whole file
    # (the line cut by a crash is kept there, and not counted)
    with caplog.at_level(logging.INFO, logger="megatron"):
        tracker = MetricsTracker(str(tmp_path), None, None, {}, True, start_iteration=20)
    tracker.log({"lm_loss": 1.5}, step=21)
    tracker.close()
    (kept,) = tmp_path.glob("metrics.*.jsonl")
    assert kept.read_text().startswith(json.dumps(old[0])) and '{"iteration": 3' in kept.read_text()
    assert [r["iteration"] for r in records(path)] == [10, 20, 21]
    assert (f"{path} holds 1 record past iteration 20 (steps after the checkpoint this run "
            f"resumes from, done again now); the file as it was is kept in {kept.name}") \
        in caplog.text
    # eval.py's tracker: appends, moves nothing
    MetricsTracker(str(tmp_path), None, None, {}, True).close()
    assert len(list(tmp_path.glob("metrics.*.jsonl"))) == 1
    # a fresh run (iteration 0) in the same log_dir: a new file, the earlier one kept
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="megatron"):
        MetricsTracker(str(tmp_path), None, None, {}, True, start_iteration=0).close()
    assert path.read_text() == "" and len(list(tmp_path.glob("metrics.*.jsonl"))) == 2
    assert f"{path} holds 3 records of an earlier run" in caplog.text
    # nothing past the start: nothing moves, nothing is said
    caplog.clear()
    MetricsTracker(str(tmp_path), None, None, {}, True, start_iteration=0).close()
    assert len(list(tmp_path.glob("metrics.*.jsonl"))) == 2 and "holds" not in caplog.text
