"""The moe_* keys are checked against each other and the layout before any worker starts, each
problem in one line naming keys and values; GPT-NeoX's own MoE config loads unchanged."""

from __future__ import annotations

import pytest

from neox_args_helpers import DATA, REPO

from megatron.neox_arguments import ConfigError, NeoXArgs

TINY = REPO / "configs/tiny.yml"


def problems(**overrides) -> str:
    with pytest.raises(ConfigError) as e:
        NeoXArgs.from_ymls([TINY], overrides)
    return str(e.value)


def test_gpt_neox_dmoe_config_loads_with_its_experts():
    args = NeoXArgs.from_ymls([DATA / "gpt-neox" / "125M-dmoe.yml"], ["num_gpus=1"])
    m = args.model
    assert (m.moe_num_experts, m.moe_top_k, m.moe_router_type, m.moe_expert_interval) == (
        8, 1, "sinkhorn", 1)
    assert (m.moe_aux_loss_coeff, m.moe_z_loss_coeff) == (0.0, 0.0)  # GPT-NeoX trains on neither
    assert args.derived.precision == "bf16" and args.derived.zero_stage == 1


def test_more_experts_per_token_than_experts():
    assert ("moe_top_k(5) must be between 1 and moe_num_experts(4): a token cannot go to more "
            "experts than there are.") in problems(moe_num_experts=4, moe_top_k=5)


def test_experts_must_split_over_tensor_ranks():
    msg = problems(moe_num_experts=6, model_parallel_size=4, num_gpus=4, hidden_size=128)
    assert ("moe_num_experts(6) % model_parallel_size(4) = 2; it must be 0: each "
            "tensor-parallel rank holds moe_num_experts / model_parallel_size whole experts.") in msg


def test_sequence_parallel_is_refused_by_name():
    msg = problems(moe_num_experts=4, model_parallel_size=2, sequence_parallel=True)
    assert "sequence_parallel with moe_num_experts > 1 is not implemented" in msg


@pytest.mark.parametrize("key,value", [("moe_top_k", 2), ("moe_aux_loss_coeff", 0.01),
                                       ("moe_router_type", "topk"), ("moe_expert_interval", 2)])
def test_moe_settings_without_experts_are_refused(key, value):
    assert (f"{key} is {value!r} but moe_num_experts is 1, so the model has no expert layers "
            f"for it to act on") in problems(**{key: value})


def test_routing_settings():
    assert "moe_normalize_topk is true but moe_router_type is sinkhorn" in problems(
        moe_num_experts=4, moe_normalize_topk=True)
    assert "moe_jitter_eps(1.5) must be in (0, 1)" in problems(moe_num_experts=4,
                                                               moe_jitter_eps=1.5)
    assert "moe_z_loss_coeff(-0.1) must be 0 or more." in problems(moe_num_experts=4,
                                                                   moe_z_loss_coeff=-0.1)


def test_expert_parallel_size_must_divide_the_experts_of_a_tensor_rank():
    msg = problems(moe_num_experts=4, model_parallel_size=2, moe_expert_parallel_size=4,
                   num_gpus=8)
    assert ("moe_num_experts(4) / model_parallel_size(2) = 2 experts per tensor rank do not "
            "split over moe_expert_parallel_size(4) ranks: choose a moe_expert_parallel_size "
            "that divides it.") in msg


def test_expert_parallel_size_must_divide_the_data_parallel_size():
    msg = problems(moe_num_experts=4, moe_expert_parallel_size=2, num_gpus=3,
                   train_batch_size=24)
    assert ("moe_expert_parallel_size(2) must divide the data-parallel size(3 = world_size 3 / "
            "(model_parallel_size 1 * pipe_parallel_size 1)): expert-parallel groups are made "
            "of data-parallel ranks.") in msg


def test_expert_parallel_settings_refused_by_name():
    assert ("moe_expert_parallel_size is 2 but moe_num_experts is 1: there are no experts to "
            "split over ranks") in problems(moe_expert_parallel_size=2, num_gpus=2)
    assert "moe_expert_parallel_size(0) must be a whole number, at least 1." in problems(
        moe_num_experts=4, moe_expert_parallel_size=0)
    zero3 = problems(moe_num_experts=4, moe_expert_parallel_size=2, num_gpus=2,
                     pipe_parallel_size=0, zero_optimization={"stage": 3})
    assert "moe_expert_parallel_size > 1 with zero_optimization.stage 3 is not supported" in zero3
    zero2 = problems(moe_num_experts=4, moe_expert_parallel_size=2, num_gpus=2,
                     pipe_parallel_size=0,
                     zero_optimization={"stage": 2, "contiguous_gradients": False})
    assert ("zero_optimization.contiguous_gradients: false with moe_expert_parallel_size > 1"
            in zero2)


def test_an_expert_parallel_layout_loads():
    args = NeoXArgs.from_ymls([TINY], {"moe_num_experts": 4, "moe_expert_parallel_size": 2,
                                       "num_gpus": 4, "model_parallel_size": 2})
    assert args.parallelism.moe_expert_parallel_size == 2
