"""Long inputs are cut into model-sized windows that score every token exactly once (A26),
the same windows lm-eval's own rolling scheme makes."""

import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from megatron.evaluation.windows import scoring_windows


@pytest.mark.parametrize("length, max_len", [(1, 4), (3, 4), (4, 4), (5, 4), (10, 4), (23, 7),
                                             (64, 64), (65, 64), (300, 64)])
def test_rolling_windows_match_lm_eval_and_score_each_token_once(length, max_len):
    text = list(range(1, length + 1))
    ours = scoring_windows([0] + text, length, max_len)
    theirs = list(get_rolling_token_windows(text, prefix_token=0, max_seq_len=max_len,
                                            context_len=1))
    assert [(list(w.inputs), list(w.targets[-w.num_scored:])) for w in ours] == [
        (list(a), list(b)) for a, b in theirs]
    scored = [t for w in ours for t in w.targets[len(w.targets) - w.num_scored:]]
    assert scored == text
    assert all(len(w.inputs) <= max_len and w.inputs[1:] == w.targets[:-1] for w in ours)


def test_a_continuation_after_a_long_context_keeps_the_nearest_context():
    tokens = list(range(100))
    (window,) = scoring_windows(tokens, 3, 10)
    assert window.inputs == tuple(range(89, 99)) and window.targets[-3:] == (97, 98, 99)
    ctx, cont = make_disjoint_window((list(window.inputs), list(window.targets[-3:])))
    assert ctx + cont == list(range(89, 100))


def test_nothing_to_score_gives_no_window_and_the_first_token_is_never_scored():
    assert scoring_windows([0], 0, 8) == []
    with pytest.raises(ValueError, match="cannot score 3 of 3 tokens"):
        scoring_windows([5, 6, 7], 3, 8)
