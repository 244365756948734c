"""The one save schedule (derived.should_save), checked against GPT-NeoX's `is_save_iter`
(megatron/training.py there) for linear and log scales, and `save_iterations` built from it."""

import pytest

from megatron.checkpointing import should_save
from megatron.neox_arguments.derived import save_iterations


def neox_is_save_iter(iteration, factor, scale, extra):
    """GPT-NeoX's rule as its source states it: extra iterations; `iteration % factor == 0`
    (linear); or iteration equal to int(p) for p = 1, factor, factor^2, ... while p <= iteration
    (log)."""
    if extra and iteration in extra:
        return True
    if not factor:
        return False
    if scale == "linear":
        return iteration % factor == 0
    p = 1
    while p < iteration + 1:
        if int(p) == iteration:
            return True
        p *= factor
    return False


@pytest.mark.parametrize("factor, scale", [(2, "log"), (1.5, "log"), (3, "log"), (1.1, "log"),
                                           (10, "linear"), (1, "linear"), (7, "linear")])
def test_matches_gpt_neox_for_every_iteration(factor, scale):
    for extra in (None, [3, 500]):
        ours = [i for i in range(1, 3000) if should_save(i, factor, scale, extra)]
        theirs = [i for i in range(1, 3000) if neox_is_save_iter(i, factor, scale, extra)]
        assert ours == theirs


def test_log_scale_iterations_for_factors_2_and_1_5():
    assert [i for i in range(1, 200) if should_save(i, 2, "log", None)] == \
        [1, 2, 4, 8, 16, 32, 64, 128]
    # 1.5**k: 1, 1.5, 2.25, 3.375, 5.06, 7.59, 11.4, 17.1, 25.6, 38.4, 57.7, 86.5, 129.7, 194.6
    assert [i for i in range(1, 200) if should_save(i, 1.5, "log", None)] == \
        [1, 2, 3, 5, 7, 11, 17, 25, 38, 57, 86, 129, 194]


@pytest.mark.parametrize("factor, scale, extra", [(2, "log", None), (1.5, "log", [0, 40]),
                                                  (25, "linear", None), (None, "linear", [3])])
def test_save_iterations_is_what_the_loop_saves(factor, scale, extra):
    """derived.save_iters lists exactly the iterations before train_iters where the loop's
    should_save fires (plus extra_save_iters such as 0)."""
    train_iters = 1000
    expected = sorted(set(extra or ()) | {i for i in range(1, train_iters)
                                          if should_save(i, factor, scale, extra)})
    assert list(save_iterations(train_iters, factor, scale, extra)) == expected
