import pytest

from tests.runs import free_port


@pytest.fixture
def one_rank(monkeypatch):
    """The environment the launcher gives a single worker."""
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(key, value)
