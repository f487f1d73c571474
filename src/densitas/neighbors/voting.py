"""Neighbour weights and votes: scikit-learn's ``"uniform"`` and ``"distance"`` (same arithmetic, same order,
so the same predictions and probabilities), RapidMiner's weighted vote (document 001), or a callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from densitas.exceptions import InputError

__all__ = ["WEIGHTS", "check_weights", "class_probabilities", "get_weights", "predict_classes", "predict_values",
           "rapidminer_weights"]

WEIGHTS = ("uniform", "distance", "rapidminer")


def check_weights(weights: Any, owner: str) -> str | Callable:
    """``weights`` must be one of :data:`WEIGHTS` or a callable."""
    if callable(weights) or (isinstance(weights, str) and weights in WEIGHTS):
        return weights
    raise InputError(f"The 'weights' parameter of {owner} must be one of {list(WEIGHTS)} or a callable. Got "
                     f"{weights!r} instead.")


def rapidminer_weights(dist: Any) -> np.ndarray:
    """RapidMiner's neighbour weights (document 001): ``wᵢ = (1 − dᵢ/D) / max(k − 1, 1)``, ``D = Σ dᵢ``.

    Every neighbour gets ``1/k`` when ``D = 0``. The weights of a row sum to 1 (for k ≥ 2). With k = 1 the only
    neighbour gets weight **1**: RapidMiner's formula gives it 0 (``1 − d/d``), which breaks its regression;
    densitas does not copy that. Neighbours at distance NaN (no coordinate in common, ``missing="skip"``) get
    weight 0 and the formula runs over the others (all 1/k if none is left).

    Parameters
    ----------
    dist : (m, k) array-like
        Distances to the k neighbours.

    Returns
    -------
    (m, k) ndarray of float64

    Examples
    --------
    >>> rapidminer_weights([[1.0, 1.0, 2.0]]).round(4).tolist()
    [[0.375, 0.375, 0.25]]
    >>> rapidminer_weights([[0.0, 0.0]]).tolist(), rapidminer_weights([[3.0]]).tolist()
    ([[0.5, 0.5]], [[1.0]])
    """
    d = np.asarray(dist, dtype=np.float64)
    if d.ndim != 2:
        raise InputError(f"'dist' must be 2-dimensional (queries × neighbours). Got shape {d.shape} instead.")
    k = d.shape[1]
    finite = ~np.isnan(d)
    kk = finite.sum(1, keepdims=True)
    dd = np.where(finite, d, 0.0)
    total = dd.sum(1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (1.0 - dd / total) / np.maximum(kk - 1, 1)
    w = np.where(finite, w, 0.0)
    zero = (total == 0)[:, 0] | (kk == 1)[:, 0]
    w[zero] = np.where(finite[zero], 1.0 / np.maximum(kk[zero], 1), 0.0)
    none_left = (kk == 0)[:, 0]
    w[none_left] = 1.0 / k
    return w


def get_weights(dist: np.ndarray | None, weights: str | Callable) -> np.ndarray | None:
    """Weights of the neighbours: None for uniform; scikit-learn's ``_get_weights`` rule for ``"distance"``
    (1/d; a query at distance 0 from some neighbours gives those weight 1 and the others 0)."""
    if weights == "uniform":
        return None
    if weights == "distance":
        with np.errstate(divide="ignore"):
            w = 1.0 / dist
        inf_mask = np.isinf(w)
        inf_row = np.any(inf_mask, axis=1)
        w[inf_row] = inf_mask[inf_row]
        return w
    if weights == "rapidminer":
        return rapidminer_weights(dist)
    return weights(dist)


def _check_not_all_zero(w: np.ndarray) -> None:
    if np.any(np.all(w == 0, axis=1)):
        raise InputError("All neighbors of some sample is getting zero weights. Please modify 'weights' to avoid "
                         "this case if you are using a user-defined function.")


def class_probabilities(y_codes: np.ndarray, neigh_ind: np.ndarray, weights: np.ndarray | None, n_classes: int,
                        normalize: bool = True) -> np.ndarray:
    """Summed weights per class (scikit-learn's loop, neighbour by neighbour), normalised to sum 1."""
    n_queries = neigh_ind.shape[0]
    if weights is None:
        weights = np.ones_like(neigh_ind)
    else:
        _check_not_all_zero(weights)
    all_rows = np.arange(n_queries)
    pred_labels = y_codes[neigh_ind]
    proba = np.zeros((n_queries, n_classes))
    for i, idx in enumerate(pred_labels.T):
        proba[all_rows, idx] += weights[:, i]
    if normalize:
        proba /= proba.sum(axis=1)[:, np.newaxis]
    return proba


def predict_classes(y_codes: np.ndarray, neigh_ind: np.ndarray, weights: np.ndarray | None, kind: Any,
                    n_classes: int) -> np.ndarray:
    """Class codes: the (weighted) mode, ties to the lowest class, as scikit-learn computes it."""
    if weights is None or kind == "rapidminer":
        return np.argmax(class_probabilities(y_codes, neigh_ind, weights, n_classes, normalize=False), axis=1)
    from sklearn.utils.extmath import weighted_mode

    _check_not_all_zero(weights)
    mode, _ = weighted_mode(y_codes[neigh_ind], weights, axis=1)
    return np.asarray(mode.ravel(), dtype=np.intp)


def predict_values(y: np.ndarray, neigh_ind: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """Mean (or weighted mean) of the neighbours' targets, in scikit-learn's order of operations."""
    _y = y.reshape((-1, 1)) if y.ndim == 1 else y
    if weights is None:
        pred = np.mean(_y[neigh_ind], axis=1)
    else:
        pred = np.empty((neigh_ind.shape[0], _y.shape[1]), dtype=np.float64)
        denom = np.sum(weights, axis=1)
        for j in range(_y.shape[1]):
            num = np.sum(_y[neigh_ind, j] * weights, axis=1)
            pred[:, j] = num / denom
    return pred.ravel() if y.ndim == 1 else pred
