"""tuner.search.content: an array's bytes, the same object for the same large contents."""

from __future__ import annotations

import numpy as np

from tuner.search import ranking
from tuner.search.content import KEPT, LARGE, content


def test_the_bytes_are_the_arrays_and_kept_only_for_equal_contents() -> None:
    rng = np.random.default_rng(0)
    small = rng.random(10)
    assert content(small) == small.tobytes()
    big = rng.random((300, 300))
    assert big.nbytes >= LARGE
    first = content(big)
    assert first == big.tobytes()
    assert content(big.copy()) is first  # equal contents: the kept object (its hash kept)
    changed = big.copy()
    changed[299, 299] += 1e-12  # the last byte's neighbourhood
    other = content(changed)
    assert other == changed.tobytes() and other is not first and other != first
    assert content(big.reshape(900, 100)) is not first  # another shape: kept apart
    assert content(big.astype(np.float32)) == big.astype(np.float32).tobytes()
    for k in range(KEPT):  # the oldest contents leave once KEPT others came since
        content(big + k + 1)
    again = content(big.copy())
    assert again == first and again is not first


def test_a_fit_is_kept_for_equal_arrays_and_made_anew_for_any_change() -> None:
    rng = np.random.default_rng(1)
    features = 200  # 60 rows of 200: a large array
    prior = rng.random(features) + 1.0
    x, y = rng.random((60, features)), rng.random(60)
    assert x.nbytes >= LARGE
    post = ranking.fit(prior, x, y, 0.1)
    assert ranking.fit(prior.copy(), x.copy(), y.copy(), 0.1) is post
    nudged = prior.copy()
    nudged[features - 1] *= 1 + 1e-15
    assert ranking.fit(nudged, x, y, 0.1) is not post
    moved = x.copy()
    moved[59, 199] += 1e-9
    assert ranking.fit(prior, moved, y, 0.1) is not post
    assert ranking.fit(prior, x, y, 0.2) is not post


def test_the_leave_one_out_width_is_scored_again_for_any_change() -> None:
    rng = np.random.default_rng(2)
    prior = rng.random(200) + 1.0
    x, y = rng.random((60, 200)), rng.random(60)
    post = ranking.fit(prior, x, y, 0.1)
    first = ranking.loo_scale(prior, x, y, 0.1, 60, post)
    assert ranking.loo_scale(prior, x.copy(), y.copy(), 0.1, 60, post) is first
    moved = x.copy()
    moved[59, 199] += 0.5  # the same fit object handed in: the rows' bytes tell them apart
    assert ranking.loo_scale(prior, moved, y, 0.1, 60, post) is not first  # scored again
