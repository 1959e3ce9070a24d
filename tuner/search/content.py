"""An array's contents as bytes to key a cache by, hashed once per contents.

The sampler keeps its fits by their exact input arrays (:func:`tuner.search.ranking.fit` and
``fit_memory``): the key is the arrays' bytes. Python keeps a bytes object's hash once
computed, but each ``a.tobytes()`` is a new object hashed anew, and the measured configs' rows
(``n x F``: 1.9 MiB with 600 measured configs and 404 features) took about 0.3 ms a MiB to
hash, a few times an ask, though they change only when a new config is measured.
:func:`content` gives, for a large array, the bytes object it gave before for the same
contents (compared byte for byte, which costs a tenth of hashing), so its kept hash is used;
the key is the same value either way.
"""

from __future__ import annotations

import threading

import numpy as np

LARGE = 64 * 1024
"""Bytes from which an array's contents are kept (smaller ones hash in microseconds)."""

KEPT = 8
"""How many large contents are kept (the last used first): an ask's fits read a few large
arrays (the time and memory fits' rows), most unchanged since the last ask."""

_kept: list[tuple[tuple[int, ...], str, bytes]] = []
_lock = threading.Lock()


def content(a: np.ndarray) -> bytes:
    """``a.tobytes()``; for a large array, the same bytes object as an earlier call's for the
    same shape, dtype and bytes (its hash computed once)."""
    data = a.tobytes()
    if len(data) < LARGE:
        return data
    shape, kind = tuple(a.shape), a.dtype.str
    with _lock:
        for i, (s, k, kept) in enumerate(_kept):
            if s == shape and k == kind and kept == data:
                _kept.insert(0, _kept.pop(i))
                return kept
        _kept.insert(0, (shape, kind, data))
        del _kept[KEPT:]
    return data
