"""The pure rank grid: validation, rank <-> coordinates, groups, and agreement with DeepSpeed."""

import pytest

from megatron.mpu import Topology


def test_degrees_must_divide_the_world_and_the_error_names_them():
    with pytest.raises(ValueError, match=r"world_size\(12\).*model_parallel_size\(5\)"):
        Topology.from_world(12, tp=5, pp=1)
    assert Topology.from_world(8, tp=2, pp=2).dp == 2
    assert Topology.from_world(4, tp=1, pp=0).pp == 1  # pp 0 (no pipeline) is one stage


def test_rank_coordinate_round_trip_and_groups():
    t = Topology(tp=2, pp=2, dp=2)
    for rank in range(8):
        c = t.coords(rank)
        assert t.rank(c.pipe, c.data, c.model) == rank
    assert t.model_parallel_group(5) == [4, 5]
    assert t.data_parallel_group(5) == [5, 7]
    assert t.pipeline_group(1) == [1, 5]
    with pytest.raises(ValueError, match="outside"):
        t.coords(8)


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 4), (2, 2, 2), (4, 1, 2), (1, 4, 1), (2, 1, 3)])
def test_layout_equals_deepspeeds_pipe_model_data_topology(tp, pp, dp):
    t = Topology(tp=tp, pp=pp, dp=dp)
    ds = t.deepspeed_topology()
    for rank in range(t.world_size):
        c = t.coords(rank)
        assert ds.get_rank(pipe=c.pipe, data=c.data, model=c.model) == rank


def test_expert_parallel_groups_split_each_data_parallel_group():
    """ep 2 over dp 4 (tp 2, pp 2): data ranks 0,1 and 2,3 exchange tokens; data ranks 0,2
    and 1,3 hold the same experts; groups never cross a stage or a tensor rank."""
    topo = Topology(tp=2, pp=2, dp=4, ep=2)
    rank = topo.rank(pipe=1, data=2, model=1)
    assert topo.coords(rank).expert == 0
    assert topo.expert_parallel_group(rank) == [topo.rank(1, 2, 1), topo.rank(1, 3, 1)]
    assert topo.expert_data_parallel_group(rank) == [topo.rank(1, 0, 1), topo.rank(1, 2, 1)]
    for r in range(topo.world_size):
        ep, edp = topo.expert_parallel_group(r), topo.expert_data_parallel_group(r)
        assert set(ep) | set(edp) <= set(topo.data_parallel_group(r))
        assert set(ep) & set(edp) == {r}
        assert [topo.coords(x).expert for x in ep] == [0, 1]
    with pytest.raises(ValueError, match=r"moe_expert_parallel_size\(3\) must divide the "
                                         r"data-parallel size\(4\)"):
        Topology(tp=1, pp=1, dp=4, ep=3)
    assert Topology.from_world(8, 2, 1, 2) == Topology(tp=2, pp=1, dp=4, ep=2)
