"""Exact k-nearest neighbours that survive big data (source document 001).

* :func:`kneighbors` — ``(distances, indices)`` of the k nearest references of every query, equal to a float64
  brute force, in memory bounded by a budget; references may be arrays, DataFrames, tensors, Parquet/CSV/.npy
  files or DuckDB relations (read in chunks).
* :class:`NearestNeighbors`, :class:`KNeighborsClassifier`, :class:`KNeighborsRegressor` — scikit-learn
  estimators on the same search, with mixed (nominal) columns, missing values and RapidMiner's weighted vote.

Metrics: ``euclidean``, ``sqeuclidean``, ``manhattan``, ``cosine``, ``mixed_euclidean``. The heavy operation
(distance tile + running top-k, ``"knn_tile_topk"``) goes through :mod:`densitas._backend.dispatch`.
"""

from __future__ import annotations

from densitas.neighbors import (
    _torch,  # noqa: F401  (registers the PyTorch "knn_tile_topk")
    _triton_registry,  # noqa: F401  (registers the fused Triton kernel, lazily)
)
from densitas.neighbors.api import kneighbors
from densitas.neighbors.distances import METRICS, MISSING
from densitas.neighbors.estimators import KNeighborsClassifier, KNeighborsRegressor, NearestNeighbors
from densitas.neighbors.voting import WEIGHTS, rapidminer_weights

__all__ = [
    "METRICS",
    "MISSING",
    "WEIGHTS",
    "KNeighborsClassifier",
    "KNeighborsRegressor",
    "NearestNeighbors",
    "kneighbors",
    "rapidminer_weights",
]
