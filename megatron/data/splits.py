"""Train/valid/test split strings ("969, 30, 1") and document-count blend weights."""

from __future__ import annotations

import math
from typing import Sequence

SPLIT_NAMES = ("train", "valid", "test")


def parse_split(split: str) -> list[float]:
    """The three fractions (summing to 1) of a split string separated by "," or "/".

    Missing parts are 0 ("98,2" is "98,2,0"); more than three parts, a negative or non-finite
    part, or all parts zero is an error.
    """
    text = str(split)
    sep = "," if "," in text else "/"
    try:
        parts = [float(p) for p in text.split(sep)]
    except ValueError:
        raise ValueError(f"split {split!r} must be up to three numbers separated by ',' or '/', "
                         "like '969, 30, 1'") from None
    if len(parts) > 3:
        raise ValueError(f"split {split!r} has {len(parts)} parts; give at most three "
                         "(train, valid, test)")
    if any(not math.isfinite(p) or p < 0 for p in parts) or sum(parts) <= 0:
        raise ValueError(f"split {split!r} must have parts that are finite, >= 0 and not all 0")
    parts += [0.0] * (3 - len(parts))
    total = sum(parts)
    return [p / total for p in parts]


def get_train_valid_test_split(split: str, size: int) -> list[int]:
    """Boundaries [0, a, b, size]: split i covers documents [bounds[i], bounds[i + 1]).

    Each part gets round(fraction * size) documents and any rounding surplus or deficit is taken
    from the front, as GPT-NeoX does, so the same string gives the same documents there.
    """
    fractions = parse_split(split)
    bounds = [0]
    for fraction in fractions:
        bounds.append(bounds[-1] + int(round(fraction * float(size))))
    diff = bounds[-1] - size
    bounds = [bounds[0]] + [b - diff for b in bounds[1:]]
    bounds = [max(0, b) for b in bounds]
    assert bounds[-1] == size and all(x <= y for x, y in zip(bounds, bounds[1:])), bounds
    return bounds


def split_document_ranges(split: str, num_documents: int) -> dict[str, range]:
    """Document ranges for "train", "valid" and "test" (empty ranges allowed)."""
    bounds = get_train_valid_test_split(split, num_documents)
    return {name: range(bounds[i], bounds[i + 1]) for i, name in enumerate(SPLIT_NAMES)}


def weights_by_num_documents(num_documents: Sequence[int], alpha: float,
                             limit: int | None = None) -> list[float]:
    """Blend weights from document counts n_i, GPT-NeoX's `weights_by_num_docs`.

    With p_i = n_i / sum(n), w_i = p_i ** alpha * (1 - p_i), normalised to sum 1 (GPT-NeoX
    normalises p ** alpha first, which cancels). So alpha = 1 does not give the document share:
    [900, 100] gives [0.5, 0.5]. A smaller alpha moves weight to the smaller datasets
    (https://arxiv.org/abs/1911.02116). One dataset gets [1.0]; where one holds every document
    (GPT-NeoX divides by zero) the weights are the shares p. `limit` caps each count used.
    """
    counts = [min(n, limit) if limit else n for n in num_documents]
    if limit is not None and limit <= 0:
        raise ValueError(f"weighted document limit must be > 0, got {limit}")
    if not counts or any(n < 0 for n in counts) or sum(counts) <= 0:
        raise ValueError(f"document counts {list(num_documents)} must be >= 0 and not all 0")
    if len(counts) == 1:
        return [1.0]
    total = sum(counts)
    unbiased = [n / total for n in counts]
    probs = [p ** alpha for p in unbiased]
    probs = [p / sum(probs) for p in probs]
    weights = [p * (1 - u) for p, u in zip(probs, unbiased)]
    if sum(weights) <= 0:  # one dataset holds every document
        return unbiased
    return [w / sum(weights) for w in weights]
