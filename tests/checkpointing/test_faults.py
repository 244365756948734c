"""The test-only fault hooks: what MEGATRON_CHECKPOINT_FAULT asks for, and nothing else."""

import pytest

from megatron.checkpointing import faults


def test_parse_kinds_ranks_and_iterations():
    assert faults.parse("kill:rank=1:iteration=4, enospc:rank=0") == [
        faults.Fault("kill", 1, 4), faults.Fault("enospc", 0, None)]


@pytest.mark.parametrize("value", ["explode:rank=1", "kill", "kill:rank=1:when=4"])
def test_a_value_that_does_not_parse_is_an_error(value):
    with pytest.raises(ValueError, match="MEGATRON_CHECKPOINT_FAULT"):
        faults.parse(value)


def test_only_the_named_rank_and_iteration_fail(monkeypatch, tmp_path):
    monkeypatch.setenv(faults.ENV, "enospc:rank=1:iteration=4")
    assert faults.planned("enospc", 1, 4)
    assert not faults.planned("enospc", 0, 4) and not faults.planned("enospc", 1, 6)
    assert not faults.planned("kill", 1, 4)
    with pytest.raises(OSError, match="No space left on device") as err:
        faults.enospc_if_planned(1, 4, tmp_path / "shard.pt")
    assert err.value.errno == 28 and 0 < (tmp_path / "shard.pt").stat().st_size
    monkeypatch.delenv(faults.ENV)
    assert not faults.planned("enospc", 1, 4)
