"""Generalized fuzzy k-means (source document 004) on the CPU or a GPU, scikit-learn style, for data larger
than memory.

* :class:`FuzzyKMeans` — the estimator: each point belongs to its ``n_nearest`` nearest clusters
  (``n_nearest = n_clusters`` is classic fuzzy c-means), centroids are ``u^q``-weighted means; data from
  arrays, tensors, Parquet/CSV/``.npy`` files or DuckDB relations, streamed in chunks within a memory budget.
* :mod:`densitas.cluster.steps` — the steps on their own: :func:`memberships`, :func:`centroid_update` with
  the four centroid methods of :data:`CENTROID_METHODS`, :func:`group_by_cluster`, :func:`schwaemmle_jensen`.
* :mod:`densitas.cluster.validity` — validity indices (partition coefficient and entropy, Xie–Beni,
  Fukuyama–Sugeno, fuzzy Davies–Bouldin, fuzzy silhouette).
"""

from __future__ import annotations

import densitas.neighbors  # (registers "knn_tile_topk", used to assign points to clusters)
import densitas.primitives  # noqa: F401  (registers histogram, scan, argsort, reduce_by_key)
from densitas.cluster import (
    _torch,  # noqa: F401  (registers the PyTorch scatter and fused passes)
    _triton_registry,  # noqa: F401  (registers the Triton kernels, lazily)
)
from densitas.cluster.fuzzy import FuzzyKMeans
from densitas.cluster.steps import (
    CENTROID_METHODS,
    Grouping,
    centroid_update,
    choose_method,
    group_by_cluster,
    memberships,
    schwaemmle_jensen,
)
from densitas.cluster.validity import (
    INDICES,
    fpc,
    fukuyama_sugeno,
    fuzzy_davies_bouldin,
    fuzzy_silhouette,
    modified_partition_coefficient,
    partition_entropy,
    xie_beni,
)

__all__ = [
    "CENTROID_METHODS",
    "INDICES",
    "FuzzyKMeans",
    "Grouping",
    "centroid_update",
    "choose_method",
    "fpc",
    "fukuyama_sugeno",
    "fuzzy_davies_bouldin",
    "fuzzy_silhouette",
    "group_by_cluster",
    "memberships",
    "modified_partition_coefficient",
    "partition_entropy",
    "schwaemmle_jensen",
    "xie_beni",
]
