"""Validity indices of fuzzy partitions — the ones users of R's e1071/fclust and of ``fuzzy-c-means`` expect.

Every index takes the memberships either dense, an (n, k) array, or sparse as ``FuzzyKMeans.membership``
returns them, a tuple ``(indices, memberships)`` of (n, M) arrays (absent entries are 0). Indices that need
the data take ``X`` (n, d) and the centroids (k, d); distances are Euclidean, computed in float64 and in chunks
(memory O(chunk · k), never n × n).

=============================  ==============================================  ============  ===============
index                          formula                                         better        source
=============================  ==============================================  ============  ===============
:func:`fpc`                    Σ u² / n                                        higher (→ 1)  Bezdek 1974
:func:`modified_partition_…`   1 − k/(k−1) · (1 − fpc)                         higher        Dave 1996
:func:`partition_entropy`      −Σ u log u / n                                  lower (→ 0)   Bezdek 1974
:func:`xie_beni`               Σ u^m D / (n · min_{i≠j} ‖v_i − v_j‖²)          lower         Xie & Beni 1991
:func:`fukuyama_sugeno`        Σ u^m (D − ‖v_j − x̄‖²)                          lower         Fukuyama 1989
:func:`fuzzy_davies_bouldin`   mean_i max_{j≠i} (S_i + S_j)/‖v_i − v_j‖        lower         fcmeans
:func:`fuzzy_silhouette`       Σ (u₁ − u₂)^α s / Σ (u₁ − u₂)^α                 higher        Campello 2006
=============================  ==============================================  ============  ===============

(D: squared distance of a point to a centroid; x̄: the data mean, as in the original Fukuyama–Sugeno index and
e1071 — ``fuzzy-c-means`` uses the centroids' mean instead.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from densitas.exceptions import InputError

__all__ = [
    "INDICES",
    "fpc",
    "fukuyama_sugeno",
    "fuzzy_davies_bouldin",
    "fuzzy_silhouette",
    "modified_partition_coefficient",
    "partition_entropy",
    "xie_beni",
]

_ROWS = 1 << 15  # rows per chunk of the distance computations


def _t(a: Any, name: str) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        t = a.detach()
    else:
        try:
            t = torch.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=np.float64)))
        except (TypeError, ValueError) as exc:
            raise InputError(f"'{name}' must be a numeric array. Got {type(a).__name__} instead.") from exc
    return t.to(torch.float64)


def _dense_u(u: Any, n_clusters: int | None = None) -> torch.Tensor:
    """Memberships as a dense float64 (n, k) tensor, from a dense array or an (indices, memberships) pair."""
    if isinstance(u, tuple):
        if len(u) != 2:
            raise InputError("Sparse memberships must be a pair (indices, memberships) of (n, M) arrays.")
        idx = u[0] if isinstance(u[0], torch.Tensor) else torch.from_numpy(np.asarray(u[0], dtype=np.int64))
        val = _t(u[1], "memberships").to(idx.device)
        if idx.shape != val.shape or idx.ndim != 2:
            raise InputError(f"indices and memberships must have the same (n, M) shape. Got {tuple(idx.shape)} and "
                             f"{tuple(val.shape)}.")
        k = n_clusters if n_clusters is not None else (int(idx.max()) + 1 if idx.numel() else 0)
        out = torch.zeros((idx.shape[0], k), dtype=torch.float64, device=idx.device)
        return out.scatter_add_(1, idx.to(torch.int64), val)
    t = _t(u, "u")
    if t.ndim != 2:
        raise InputError(f"'u' must be an (n, k) array. Got shape {tuple(t.shape)} instead.")
    return t


def _check(X: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> None:
    if X.ndim != 2 or V.ndim != 2 or X.shape[1] != V.shape[1]:
        raise InputError(f"'X' (n, d) and 'centers' (k, d) must have the same width. Got {tuple(X.shape)} and "
                         f"{tuple(V.shape)}.")
    if U.shape != (X.shape[0], V.shape[0]):
        raise InputError(f"The memberships must have shape (n, k) = ({X.shape[0]}, {V.shape[0]}). Got "
                         f"{tuple(U.shape)}.")
    if V.shape[0] < 2:
        raise InputError("Validity indices need at least two clusters.")


def _sq_dist(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """Squared Euclidean distances (len(A), len(B)) by direct differences, chunked over A."""
    out = torch.empty((A.shape[0], B.shape[0]), dtype=torch.float64, device=A.device)
    step = max(_ROWS // max(B.shape[0], 1), 1)
    for s in range(0, A.shape[0], step):
        diff = A[s:s + step, None, :] - B[None, :, :]
        out[s:s + step] = (diff * diff).sum(2)
    return out


def _center_gap(V: torch.Tensor) -> torch.Tensor:
    d2 = _sq_dist(V, V)
    d2.fill_diagonal_(math.inf)
    return d2


def fpc(u: Any) -> float:
    """Fuzzy partition coefficient ``Σ u² / n`` (Bezdek 1974): 1 for a crisp partition, 1/k for the fuzziest.

    Parameters
    ----------
    u : (n, k) array, or a pair (indices, memberships) of (n, M) arrays

    Examples
    --------
    >>> fpc([[1.0, 0.0], [0.5, 0.5]])
    0.75
    """
    U = _dense_u(u)
    return float((U * U).sum() / U.shape[0])


def modified_partition_coefficient(u: Any, n_clusters: int | None = None) -> float:
    """Dave's modified partition coefficient ``1 − k/(k−1) (1 − fpc)``, in [0, 1] whatever k.

    Parameters
    ----------
    u : (n, k) array, or a pair (indices, memberships)
    n_clusters : int, optional
        k (needed for the sparse form when not every cluster appears).

    Examples
    --------
    >>> modified_partition_coefficient([[1.0, 0.0], [0.5, 0.5]])
    0.5
    """
    U = _dense_u(u, n_clusters)
    k = U.shape[1]
    if k < 2:
        raise InputError("The modified partition coefficient needs at least two clusters.")
    return float(1.0 - k / (k - 1) * (1.0 - (U * U).sum() / U.shape[0]))


def partition_entropy(u: Any, base: float = math.e) -> float:
    """Partition entropy ``−Σ u log u / n`` (Bezdek 1974; 0 log 0 = 0): 0 for a crisp partition, ``log k`` at most.

    Parameters
    ----------
    u : (n, k) array, or a pair (indices, memberships)
    base : float
        Of the logarithm; e as in e1071 (``fuzzy-c-means`` uses 2).

    Examples
    --------
    >>> round(partition_entropy([[1.0, 0.0], [0.5, 0.5]], base=2), 6)
    0.5
    """
    U = _dense_u(u)
    safe = torch.where(U > 0, U, 1.0)
    return float(-(U * torch.log(safe)).sum() / U.shape[0] / math.log(base))


def xie_beni(X: Any, u: Any, centers: Any, fuzzifier: float = 2.0) -> float:
    """Xie–Beni index ``Σ u^m ‖x − v‖² / (n · min_{i≠j} ‖v_i − v_j‖²)`` (Xie & Beni 1991; lower is better).

    Parameters
    ----------
    X : (n, d) array
    u : (n, k) array, or a pair (indices, memberships)
    centers : (k, d) array
    fuzzifier : float
        m (e1071 and ``fuzzy-c-means`` use the model's; the original paper used 2).

    Examples
    --------
    >>> X, V = [[0.0], [1.0], [9.0], [10.0]], [[0.5], [9.5]]
    >>> round(xie_beni(X, [[1, 0], [1, 0], [0, 1], [0, 1]], V), 6)
    0.003086
    """
    Xt, V = _t(X, "X"), _t(centers, "centers")
    U = _dense_u(u, V.shape[0])
    _check(Xt, U, V)
    num = (U.pow(fuzzifier) * _sq_dist(Xt, V)).sum()
    return float(num / (Xt.shape[0] * _center_gap(V).min()))


def fukuyama_sugeno(X: Any, u: Any, centers: Any, fuzzifier: float = 2.0) -> float:
    """Fukuyama–Sugeno index ``Σ u^m (‖x − v_j‖² − ‖v_j − x̄‖²)`` with x̄ the data mean (lower is better).

    Examples
    --------
    >>> X, V = [[0.0], [1.0], [9.0], [10.0]], [[0.5], [9.5]]
    >>> fukuyama_sugeno(X, [[1, 0], [1, 0], [0, 1], [0, 1]], V)
    -80.0
    """
    Xt, V = _t(X, "X"), _t(centers, "centers")
    U = _dense_u(u, V.shape[0])
    _check(Xt, U, V)
    xbar = Xt.mean(0)
    spread = ((V - xbar) ** 2).sum(1)
    return float((U.pow(fuzzifier) * (_sq_dist(Xt, V) - spread[None, :])).sum())


def fuzzy_davies_bouldin(X: Any, u: Any, centers: Any, fuzzifier: float = 2.0) -> float:
    """Fuzzy Davies–Bouldin index (lower is better), as in ``fuzzy-c-means``.

    ``S_i = √(Σ_k u_ik^m ‖x_k − v_i‖² / Σ_k u_ik^m)``; ``DB = mean_i max_{j≠i} (S_i + S_j) / ‖v_i − v_j‖``.

    Examples
    --------
    >>> X, V = [[0.0], [1.0], [9.0], [10.0]], [[0.5], [9.5]]
    >>> round(fuzzy_davies_bouldin(X, [[1, 0], [1, 0], [0, 1], [0, 1]], V), 6)
    0.111111
    """
    Xt, V = _t(X, "X"), _t(centers, "centers")
    U = _dense_u(u, V.shape[0])
    _check(Xt, U, V)
    um = U.pow(fuzzifier)
    scatter = torch.sqrt((um * _sq_dist(Xt, V)).sum(0) / um.sum(0))
    ratio = (scatter[:, None] + scatter[None, :]) / torch.sqrt(_center_gap(V))
    ratio.fill_diagonal_(-math.inf)
    return float(ratio.max(1).values.mean())


def fuzzy_silhouette(X: Any, u: Any, alpha: float = 1.0) -> float:
    """Fuzzy silhouette (Campello & Hruschka 2006; higher is better).

    The silhouette ``s = (b − a) / max(a, b)`` of every point on the crisp partition ``argmax u`` (a: mean
    distance to its own cluster, b: to the nearest other cluster; 0 for singletons), averaged with the weights
    ``(u₁ − u₂)^α`` of the two largest memberships. O(n² d) time, O(chunk · n) memory.

    Parameters
    ----------
    X : (n, d) array
    u : (n, k) array, or a pair (indices, memberships)
    alpha : float

    Examples
    --------
    >>> X = [[0.0], [1.0], [9.0], [10.0]]
    >>> round(fuzzy_silhouette(X, [[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.2, 0.8]]), 4)
    0.8885
    """
    Xt = _t(X, "X")
    U = _dense_u(u)
    n, k = U.shape
    if Xt.shape[0] != n:
        raise InputError(f"'X' and the memberships must have the same rows. Got {Xt.shape[0]} and {n}.")
    labels = U.argmax(1)
    onehot = torch.nn.functional.one_hot(labels, k).to(torch.float64)
    counts = onehot.sum(0)
    if int((counts > 0).sum()) < 2:
        raise InputError("The fuzzy silhouette needs at least two non-empty clusters.")
    sums = torch.empty((n, k), dtype=torch.float64)
    step = max(_ROWS // max(n, 1), 1) * 8
    for s in range(0, n, step):
        diff = Xt[s:s + step, None, :] - Xt[None, :, :]
        sums[s:s + step] = torch.sqrt((diff * diff).sum(2)) @ onehot
    own = counts[labels]
    a = sums.gather(1, labels[:, None]).squeeze(1) / torch.clamp(own - 1, min=1)
    mean_to = sums / torch.where(counts > 0, counts, 1.0)[None, :]
    mean_to[counts[None, :].expand(n, k) == 0] = math.inf
    mean_to.scatter_(1, labels[:, None], math.inf)
    b = mean_to.min(1).values
    den = torch.maximum(a, b)
    sil = torch.where((own > 1) & (den > 0), (b - a) / torch.where(den > 0, den, 1.0), 0.0)
    top2 = torch.topk(U, min(2, k), dim=1).values
    w = (top2[:, 0] - (top2[:, 1] if k > 1 else 0.0)) ** alpha
    return float((w * sil).sum() / w.sum())


#: name → (function, True when higher is better)
INDICES = {
    "fpc": (fpc, True),
    "modified_partition_coefficient": (modified_partition_coefficient, True),
    "partition_entropy": (partition_entropy, False),
    "xie_beni": (xie_beni, False),
    "fukuyama_sugeno": (fukuyama_sugeno, False),
    "fuzzy_davies_bouldin": (fuzzy_davies_bouldin, False),
    "fuzzy_silhouette": (fuzzy_silhouette, True),
}
