"""Process groups built from a Topology on real gloo processes; misuse is refused (A3); the
tensor-parallel RNG stream differs across tp ranks where it must and agrees where it must."""

import pytest
import torch

from megatron.mpu.groups import ProcessGroups
from megatron.mpu.topology import Topology
from tests.distributed import run_distributed


def _groups(rank, world):
    import torch.distributed as dist

    groups = ProcessGroups.build(Topology(tp=2, pp=1, dp=2))
    members = {}
    for name, group in (("tp", groups.tp_group), ("dp", groups.dp_group)):
        gathered = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, rank, group=group)
        members[name] = gathered
    try:
        ProcessGroups.build(Topology(tp=1, pp=1, dp=4))
        second = "built"
    except RuntimeError as err:
        second = str(err)
    again = ProcessGroups.build(Topology(tp=2, pp=1, dp=2))  # the same layout is fine
    tp = again.tensor_parallel(seed=5)
    torch.manual_seed(5)
    with tp.split_region_rng():
        split = torch.rand(3)
    shared = torch.rand(3)
    return members, second, split, shared


def test_groups_layout_second_layout_and_rng_streams():
    results = run_distributed(_groups, 4)
    assert [r[0]["tp"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r[0]["dp"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    for _, second, _, _ in results:
        assert "already built for tp=2 pp=1 dp=2" in second and "tp=1 pp=1 dp=4" in second
    # split regions: tp ranks 0 and 1 draw differently; the two replicas' tp rank 0 agree
    assert not torch.equal(results[0][2], results[1][2])
    assert torch.equal(results[0][2], results[2][2])
    # replicated regions: every rank draws the same, and the fork did not advance the stream
    torch.manual_seed(5)
    expected = torch.rand(3)
    assert all(torch.equal(r[3], expected) for r in results)


def test_groups_before_init_is_a_clear_error():
    with pytest.raises(RuntimeError, match="before torch.distributed was initialised"):
        ProcessGroups.build(Topology(1, 1, 1))
