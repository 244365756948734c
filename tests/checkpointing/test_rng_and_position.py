"""RNG states and the data position: what a resumed run needs to continue exactly."""

import random

import numpy as np
import pytest
import torch

from megatron.checkpointing import data_position, rng
from megatron.mpu.random import TensorParallelRNG


def draws(tp_rng):
    with tp_rng.fork():
        split = torch.rand(3)
    return random.random(), float(np.random.rand()), torch.rand(3), split


def test_restored_states_draw_the_same_numbers(tmp_path):
    tp_rng = TensorParallelRNG(seed=7, tp_rank=1)
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    draws(tp_rng)
    record = rng.save(tmp_path, "rng/rank_0.pt", tp_rng)
    expected = draws(tp_rng)
    draws(tp_rng)  # move everything on
    other = TensorParallelRNG(seed=99, tp_rank=0)
    assert rng.restore(rng.load(tmp_path, "rng/rank_0.pt", record), other) == []
    got = draws(other)
    assert got[:2] == expected[:2]
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])


def test_a_missing_tensor_parallel_stream_is_reported_not_ignored():
    state = rng.capture(tp_rng=None)
    skipped = rng.restore(state, TensorParallelRNG(seed=1, tp_rank=0))
    assert skipped == ["the tensor-parallel dropout stream (not in the checkpoint)"]


def test_client_state_is_plain_json_with_the_iteration():
    state = data_position.client_state(6, {"consumed_train_samples": 96, "fingerprints": ("a", 1)})
    assert state == {"consumed_train_samples": 96, "fingerprints": ["a", 1], "iteration": 6}
    with pytest.raises(TypeError, match="client state 'bad'"):
        data_position.client_state(6, {"bad": object()})


def test_ranks_passing_different_positions_are_named():
    same = {"iteration": 6, "consumed_train_samples": 96}
    assert data_position.disagreement([same, dict(same)]) is None
    problem = data_position.disagreement([same, {**same, "consumed_train_samples": 80}])
    assert problem == ("ranks passed different client states to save_checkpoint "
                       "(consumed_train_samples: rank 0 96 vs rank 1 80)")
