# SPDX-License-Identifier: Apache-2.0
"""Encoded data in chunks, as the reference design's ``mixle.stats`` gives it: ``seq_encode`` cuts the rows into
chunks and encodes each with a family's encoder; ``seq_log_density`` and ``seq_log_density_sum`` score them. Exported
by ``attnmix.stats`` and ``attnmix.inference``."""
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from attnmix import _core

__all__ = ["seq_encode", "seq_log_density", "seq_log_density_sum"]


def _encoder_of(encoder: Any, estimator: Any, model: Any):
    """The data encoder of whichever one of an encoder, an estimator or a model was given, by keyword or in any of
    the three slots (the reference accepts a model or an estimator in the encoder slot)."""
    given = [x for x in (encoder, estimator, model) if x is not None]
    if len(given) != 1:
        raise TypeError(f"seq_encode: give exactly one of encoder, estimator or model (got {len(given)})")
    source = given[0]
    if isinstance(source, _core.DataEncoder):
        return source
    if isinstance(source, _core.Distribution):
        return source.dist_to_encoder()
    if isinstance(source, _core.Estimator):
        return source.accumulator_factory().make().acc_to_encoder()
    raise TypeError(f"seq_encode: expected a DataEncoder, an Estimator or a Distribution (got {type(source).__name__})")


def seq_encode(data: Sequence[Any], encoder: Any = None, estimator: Any = None, model: Any = None,
               num_chunks: int = 1, chunk_size: Optional[int] = None) -> List[Tuple[int, Any]]:
    """The rows of ``data`` encoded in chunks: a list of ``(count, encoded)``.

    Row i goes to chunk ``i mod num_chunks``; with ``chunk_size``, ``num_chunks = ceil(len(data) / chunk_size)``.
    The encoder is ``encoder``, or that of an ``estimator`` or a ``model`` (any of them may stand in the encoder slot).
    Empty chunks are left out. TypeError / ValueError as the encoder raises them.

    Example:

    >>> import attnmix
    >>> from attnmix.stats import seq_encode
    >>> chunks = seq_encode([0, 1, 1, 2, 1], estimator=attnmix.CategoricalEstimator(3), num_chunks=2)
    >>> [count for count, _ in chunks]  # rows 0, 2, 4 and rows 1, 3
    [3, 2]
    """
    enc = _encoder_of(encoder, estimator, model)
    rows = list(data)
    if chunk_size is not None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"seq_encode: chunk_size must be a positive integer (got {chunk_size!r})")
        num_chunks = max(1, math.ceil(len(rows) / chunk_size))
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks <= 0:
        raise ValueError(f"seq_encode: num_chunks must be a positive integer (got {num_chunks!r})")
    out = []
    for c in range(num_chunks):
        chunk = rows[c::num_chunks]
        if chunk:
            out.append((len(chunk), enc.seq_encode(chunk)))
    return out


def seq_log_density(enc_data: Sequence[Tuple[int, Any]], estimate: Any) -> List[np.ndarray]:
    """The log density of every row of every chunk of ``seq_encode``'s output under ``estimate``: one array per
    chunk.

    Example:

    >>> import attnmix
    >>> from attnmix.stats import seq_encode, seq_log_density
    >>> model = attnmix.CategoricalDistribution([0.25, 0.5, 0.25])
    >>> chunks = seq_encode([0, 1, 1], model=model, num_chunks=2)
    >>> [(log_p / log_p[-1]).tolist() for log_p in seq_log_density(chunks, model)]  # log 0.25 = 2 log 0.5
    [[2.0, 1.0], [1.0]]
    """
    return [np.asarray(estimate.seq_log_density(encoded)) for _, encoded in enc_data]


def seq_log_density_sum(enc_data: Sequence[Tuple[int, Any]], estimate: Any) -> Tuple[int, float]:
    """``(rows, total log density)`` over every chunk of ``seq_encode``'s output under ``estimate``.

    Example:

    >>> import math
    >>> import attnmix
    >>> from attnmix.stats import seq_encode, seq_log_density_sum
    >>> model = attnmix.CategoricalDistribution([0.5, 0.5])
    >>> rows, total = seq_log_density_sum(seq_encode([0, 1, 1, 0], model=model, num_chunks=3), model)
    >>> rows, math.isclose(total, 4 * math.log(0.5))
    (4, True)
    """
    count = sum(int(n) for n, _ in enc_data)
    total = float(sum(float(np.sum(ll)) for ll in seq_log_density(enc_data, estimate)))
    return count, total
