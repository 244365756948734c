import pytest

from tests.runs import build_small_dataset


@pytest.fixture(scope="session")
def small_data(tmp_path_factory):
    """(data prefix, tokenizer path) of a real dataset built from the built-in corpus."""
    return build_small_dataset(tmp_path_factory.mktemp("ckpt-data"))
