import pytest

from tests.text_generation.models import trained_checkpoint


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """configs/tiny.yml trained briefly: {"data", "tokenizer", "ckpt", "overrides"}."""
    return trained_checkpoint(tmp_path_factory.getbasetemp() / "trained_tiny")
