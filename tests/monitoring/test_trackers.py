"""wandb_host: the credentials looked up for it, and the server wandb is started with (offline,
see tests/conftest.py: no network is contacted)."""

from __future__ import annotations

import logging

import pytest

from megatron.monitoring.trackers import (DEFAULT_WANDB_HOST, MetricsTracker, wandb_enabled,
                                          wandb_has_credentials, wandb_server)
from megatron.neox_arguments import NeoXArgs
from tests.logs import Warnings
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
