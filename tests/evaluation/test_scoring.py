"""Scoring windows: log-probs in fp32 checked at the boundary (A27), out-of-memory batches
halved and retried (A26), and the same answers whatever the batch size."""

import pytest
import torch

from megatron.evaluation.scoring import check_logprobs, score_windows
from megatron.evaluation.windows import scoring_windows
from tests.text_generation.models import small_model


def windows():
    g = torch.Generator().manual_seed(4)
    out = []
    for i, n in enumerate([5, 30, 12, 70, 2, 9]):
        tokens = torch.randint(1, 128, (n,), generator=g).tolist()
        out += scoring_windows(tokens, min(3, n - 1), 48, request=i)
    return out


@pytest.mark.parametrize("variant", ["neox", "mamba_hybrid"])
def test_scores_do_not_depend_on_the_batch_size(variant):
    """Windows of different lengths share a batch (padded after their tokens); a model with a
    Mamba layer, whose state runs along the sequence, scores them as alone too."""
    model, _ = small_model(variant)
    one = score_windows(model, windows(), batch_size=1)
    many = score_windows(model, windows(), batch_size=4)
    assert [g for _, g in one] == [g for _, g in many]
    assert [s for s, _ in one] == pytest.approx([s for s, _ in many], abs=1e-4)


def test_an_out_of_memory_batch_is_halved_and_retried(monkeypatch, caplog):
    model, _ = small_model()
    expected = score_windows(model, windows(), batch_size=1)
    forward = model.forward
    sizes = []

    def limited(tokens, positions, *rest, **kw):
        sizes.append(tokens.shape[0])
        if tokens.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(tokens, positions, *rest, **kw)

    monkeypatch.setattr(model, "forward", limited)
    got = score_windows(model, windows(), batch_size=8)
    assert sizes[:3] == [6, 4, 2] and max(sizes[3:]) <= 2  # 6 windows: batch 8 -> 4 -> 2
    assert [s for s, _ in got] == pytest.approx([s for s, _ in expected], abs=1e-4)
    assert "retrying with batch size 2" in caplog.text
    monkeypatch.setattr(model, "forward", lambda *a, **k: (_ for _ in ()).throw(
        torch.OutOfMemoryError("simulated")))
    with pytest.raises(RuntimeError, match=r"out of memory scoring a batch of 1 window\(s\) of "
                       r"up to \d+ tokens; lower eval_batch_size"):
        score_windows(model, windows(), batch_size=1)


def test_log_probs_are_checked_for_dtype_shape_and_finiteness():
    check_logprobs(torch.zeros(2, 3), (2, 3), "batch")
    with pytest.raises(RuntimeError, match=r"batch: log-probs are torch.bfloat16, expected "
                       r"torch.float32"):
        check_logprobs(torch.zeros(2, 3, dtype=torch.bfloat16), (2, 3), "batch")
    with pytest.raises(RuntimeError, match=r"have shape \(3, 2\), expected \(2, 3\)"):
        check_logprobs(torch.zeros(3, 2), (2, 3), "batch")
    with pytest.raises(RuntimeError, match=r"batch: 1 log-prob\(s\) are not finite"):
        check_logprobs(torch.tensor([[0.0, float("nan"), -1.0]]), (1, 3), "batch")
