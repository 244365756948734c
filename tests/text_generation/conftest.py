import pytest

from tests.runs import free_port

from tests.text_generation.models import trained_checkpoint


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """configs/tiny.yml trained briefly: {"data", "tokenizer", "ckpt", "overrides"}."""
    return trained_checkpoint(tmp_path_factory.getbasetemp() / "trained_tiny")


@pytest.fixture
def one_rank(monkeypatch):
    """The environment the launcher gives a single worker."""
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
