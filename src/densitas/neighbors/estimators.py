"""scikit-learn-compatible ``NearestNeighbors``, ``KNeighborsClassifier`` and ``KNeighborsRegressor`` on the exact,
bounded-memory search of :mod:`densitas.neighbors.search`, with mixed (nominal) columns, missing values and
RapidMiner's weighted vote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, check_consistent_length, check_is_fitted, column_or_1d, validate_data

from densitas._backend.device import resolve_device
from densitas._dask import is_dask
from densitas.exceptions import InputError
from densitas.neighbors.api import build_references, check_budget, check_k, check_missing, encode_queries
from densitas.neighbors.distances import Encoded, get_metric
from densitas.neighbors.search import References, search
from densitas.neighbors.voting import check_weights, class_probabilities, get_weights, predict_classes, predict_values

__all__ = ["KNeighborsClassifier", "KNeighborsRegressor", "NearestNeighbors"]


def _is_table(X: Any, nominal: Any) -> bool:
    """A DataFrame with non-numeric columns, or any DataFrame when nominal columns are named."""
    import pandas as pd

    if not isinstance(X, pd.DataFrame):
        return False
    if nominal is not None:
        return True
    return any(not (pd.api.types.is_numeric_dtype(d) or pd.api.types.is_bool_dtype(d)) for d in X.dtypes)


class _NeighborsBase(BaseEstimator):
    """Shared parameters, fitting and the neighbour search."""

    def __init__(self, n_neighbors: int = 5, *, metric: str = "euclidean", nominal_features: Any = None,
                 missing: str = "raise", device: Any = "auto", memory_budget: int | str | None = None):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.nominal_features = nominal_features
        self.missing = missing
        self.device = device
        self.memory_budget = memory_budget

    def _check_params(self) -> None:
        owner = type(self).__name__
        k = self.n_neighbors
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise InputError(f"The 'n_neighbors' parameter of {owner} must be an int ≥ 1. Got {k!r} instead.")
        get_metric(self.metric, owner)
        check_missing(self.missing, owner)
        check_budget(self.memory_budget, owner)
        if hasattr(self, "weights"):
            check_weights(self.weights, owner)

    def _validate(self, X: Any, reset: bool) -> Any:
        """Run scikit-learn's checks (feature names and counts, 2-D, sparse, non-empty); return what to encode."""
        table = _is_table(X, self.nominal_features) if reset else getattr(self, "_table_input", False)
        kw = {"reset": reset, "ensure_all_finite": False, "ensure_min_samples": 1}
        if table:
            import pandas as pd

            if not isinstance(X, pd.DataFrame):
                raise InputError(f"{type(self).__name__} was fitted on a DataFrame with nominal columns; pass a "
                                 "DataFrame with the same columns.")
            validate_data(self, X, dtype=None, **kw)
            return X
        return validate_data(self, X, dtype=[np.float64, np.float32], **kw)

    def _fit_X(self, X: Any) -> Any:
        if is_dask(X):  # the references stay sharded on the Dask cluster (densitas.neighbors.dask)
            from densitas.neighbors.dask import fit_references

            return fit_references(self, X)
        self.__dict__.pop("_dask_refs", None)
        self._check_params()
        self._table_input = _is_table(X, self.nominal_features)
        data = self._validate(X, reset=True)
        metric = get_metric(self.metric, type(self).__name__)
        self._refs: References = build_references(data, metric, self.nominal_features, self.missing,
                                                  owner=type(self).__name__)
        self.n_samples_fit_ = self._refs.n_rows
        self.effective_metric_ = self.metric
        return data

    def _search(self, q: Encoded, k: int) -> tuple[np.ndarray, np.ndarray]:
        metric = get_metric(self.metric, type(self).__name__)
        dev = resolve_device(self.device)
        fast = None
        if q.num is not None:
            fast = torch.float32 if (q.num.dtype == torch.float32 and self._refs.float_dtype == np.float32) \
                else torch.float64
        d, i = search(self._refs, q, k, metric, skip=self.missing == "skip", device=dev,
                      budget=check_budget(self.memory_budget), fast_dtype=fast)
        return d.cpu().numpy(), i.cpu().numpy()

    def kneighbors(self, X: Any = None, n_neighbors: int | None = None,
                   return_distance: bool = True) -> Any:
        """The nearest fitted rows of each query row.

        Parameters
        ----------
        X : (m, d) array-like or DataFrame, optional
            Queries. None: every fitted row, not counted as its own neighbour (scikit-learn's convention: the
            row itself is removed, or its first duplicate when more duplicates than neighbours exist).
        n_neighbors : int, optional
            Defaults to the ``n_neighbors`` of the estimator.
        return_distance : bool

        Returns
        -------
        distances : (m, k) ndarray of float64, only when ``return_distance``
        indices : (m, k) ndarray of int64
            Ascending by distance; ties by lower index.
        """
        check_is_fitted(self, "n_samples_fit_")
        if is_dask(X) or hasattr(self, "_dask_refs"):
            from densitas.neighbors.dask import estimator_neighbours

            d, i, _lazy = estimator_neighbours(self, X, n_neighbors)
            return (d, i) if return_distance else i
        k = self.n_neighbors if n_neighbors is None else n_neighbors
        owner = type(self).__name__
        if X is None:
            if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k < self.n_samples_fit_:
                raise InputError(f"The 'n_neighbors' parameter of {owner}.kneighbors must be an int in [1, "
                                 f"n_samples_fit - 1] = [1, {self.n_samples_fit_ - 1}] when X is None. Got {k!r} "
                                 "instead.")
            q = self._refs.encoded
            d, i = self._search(q, int(k) + 1)
            n = q.n
            mask = i != np.arange(n)[:, None]
            dup = np.all(mask, axis=1)
            mask[:, 0][dup] = False
            i = i[mask].reshape(n, int(k))
            d = d[mask].reshape(n, int(k))
        else:
            k = check_k(k, self.n_samples_fit_, "n_neighbors", owner)
            q = self._queries(X)
            d, i = self._search(q, k)
        return (d, i) if return_distance else i

    def _queries(self, X: Any) -> Encoded:
        data = self._validate(X, reset=False)
        return encode_queries(data, self._refs, self.missing, torch.device("cpu"), name="X")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = self.missing == "skip"
        return tags


class NearestNeighbors(_NeighborsBase):
    """Exact k nearest neighbours with scikit-learn's interface, bounded in memory, on the CPU or a GPU.

    Parameters
    ----------
    n_neighbors : int, default 5
    metric : {"euclidean", "sqeuclidean", "manhattan", "cosine", "mixed_euclidean"}, default "euclidean"
    nominal_features : list of column names or positions, or a boolean mask, optional
        Nominal columns (compared for equality by ``mixed_euclidean``); string and categorical DataFrame columns
        are nominal anyway.
    missing : {"raise", "skip"}, default "raise"
        ``"skip"``: coordinate pairs with NaN are left out (document 001); rows with nothing in common are at
        distance NaN and rank last.
    device : "auto", "cpu", "cuda" or "cuda:N"
    memory_budget : int or str, optional
        Working-memory bound of a search (e.g. ``"1GB"``).

    Attributes
    ----------
    n_samples_fit_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str (DataFrame input)
    effective_metric_ : str

    Notes
    -----
    Results equal a float64 brute force (see :func:`densitas.neighbors.kneighbors`).

    Examples
    --------
    >>> import numpy as np
    >>> nn = NearestNeighbors(n_neighbors=2, device="cpu").fit(np.array([[0.0], [1.0], [3.0]]))
    >>> d, i = nn.kneighbors([[0.9]])
    >>> i.tolist(), d.round(2).tolist()
    ([[1, 0]], [[0.1, 0.9]])
    """

    def fit(self, X: Any, y: Any = None) -> NearestNeighbors:
        """Store the reference rows.

        Parameters
        ----------
        X : (n, d) array-like or DataFrame
        y : ignored

        Returns
        -------
        self
        """
        self._fit_X(X)
        return self


class KNeighborsClassifier(ClassifierMixin, _NeighborsBase):
    """k-NN classification with exact neighbours; scikit-learn's votes, or RapidMiner's (document 001).

    Parameters
    ----------
    n_neighbors : int, default 5
    weights : {"uniform", "distance", "rapidminer"} or callable, default "uniform"
        ``"uniform"`` and ``"distance"`` give exactly scikit-learn's predictions and probabilities (1/d, and a
        query at distance 0 from some neighbours votes for those alone). ``"rapidminer"``: see
        :func:`densitas.neighbors.rapidminer_weights`; class probabilities are the summed weights. A callable
        maps the (m, k) distances to weights.
    metric, nominal_features, missing, device, memory_budget
        As in :class:`NearestNeighbors`.

    Attributes
    ----------
    classes_ : ndarray
    n_samples_fit_, n_features_in_, feature_names_in_, effective_metric_

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [2.0], [3.0]])
    >>> clf = KNeighborsClassifier(n_neighbors=3, device="cpu").fit(X, ["a", "a", "b", "b"])
    >>> clf.predict([[1.1]]).tolist(), clf.predict_proba([[1.1]]).round(3).tolist()
    (['a'], [[0.667, 0.333]])
    """

    def __init__(self, n_neighbors: int = 5, *, weights: str | Callable = "uniform", metric: str = "euclidean",
                 nominal_features: Any = None, missing: str = "raise", device: Any = "auto",
                 memory_budget: int | str | None = None):
        super().__init__(n_neighbors, metric=metric, nominal_features=nominal_features, missing=missing,
                         device=device, memory_budget=memory_budget)
        self.weights = weights

    def fit(self, X: Any, y: Any) -> KNeighborsClassifier:
        """Store the training rows and labels.

        Parameters
        ----------
        X : (n, d) array-like or DataFrame
        y : (n,) array-like of labels

        Returns
        -------
        self
        """
        if y is None:
            raise InputError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        self._fit_X(X)
        y = column_or_1d(check_array(y, ensure_2d=False, dtype=None, ensure_all_finite=False), warn=True)
        check_consistent_length(np.empty(self.n_samples_fit_), y)
        check_classification_targets(y)
        self.classes_, self._y = np.unique(y, return_inverse=True)
        return self

    def _neighbours(self, X: Any) -> tuple[np.ndarray | None, np.ndarray]:
        check_is_fitted(self, "classes_")
        if self.weights == "uniform":
            return None, self.kneighbors(X, return_distance=False)
        return self.kneighbors(X)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, (m, n_classes), classes in the order of ``classes_``.

        Parameters
        ----------
        X : (m, d) array-like or DataFrame

        Returns
        -------
        (m, n_classes) ndarray
        """
        if is_dask(X) or hasattr(self, "_dask_refs"):
            from densitas.neighbors.dask import estimator_predict

            check_is_fitted(self, "classes_")
            return estimator_predict(self, X, "proba")
        dist, ind = self._neighbours(X)
        w = get_weights(dist, self.weights)
        return class_probabilities(self._y, ind, w, len(self.classes_), normalize=self.weights != "rapidminer")

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels.

        Parameters
        ----------
        X : (m, d) array-like or DataFrame

        Returns
        -------
        (m,) ndarray
        """
        if is_dask(X) or hasattr(self, "_dask_refs"):
            from densitas.neighbors.dask import estimator_predict

            check_is_fitted(self, "classes_")
            return estimator_predict(self, X, "classes")
        dist, ind = self._neighbours(X)
        w = get_weights(dist, self.weights)
        return self.classes_.take(predict_classes(self._y, ind, w, self.weights, len(self.classes_)))


class KNeighborsRegressor(RegressorMixin, _NeighborsBase):
    """k-NN regression with exact neighbours: the mean, scikit-learn's 1/d weighted mean, RapidMiner's weights
    (document 001; with k = 1 the neighbour has weight 1, not RapidMiner's 0) or a callable.

    Parameters
    ----------
    n_neighbors : int, default 5
    weights : {"uniform", "distance", "rapidminer"} or callable, default "uniform"
    metric, nominal_features, missing, device, memory_budget
        As in :class:`NearestNeighbors`.

    Attributes
    ----------
    n_samples_fit_, n_features_in_, feature_names_in_, effective_metric_

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[0.0], [1.0], [2.0], [4.0]])
    >>> reg = KNeighborsRegressor(n_neighbors=2, weights="rapidminer", device="cpu").fit(X, [0.0, 10.0, 20.0, 40.0])
    >>> reg.predict([[1.5]]).tolist()
    [15.0]
    """

    def __init__(self, n_neighbors: int = 5, *, weights: str | Callable = "uniform", metric: str = "euclidean",
                 nominal_features: Any = None, missing: str = "raise", device: Any = "auto",
                 memory_budget: int | str | None = None):
        super().__init__(n_neighbors, metric=metric, nominal_features=nominal_features, missing=missing,
                         device=device, memory_budget=memory_budget)
        self.weights = weights

    def fit(self, X: Any, y: Any) -> KNeighborsRegressor:
        """Store the training rows and targets.

        Parameters
        ----------
        X : (n, d) array-like or DataFrame
        y : (n,) array-like of numbers

        Returns
        -------
        self
        """
        if y is None:
            raise InputError(f"{type(self).__name__} requires y to be passed, but the target y is None.")
        self._fit_X(X)
        y = column_or_1d(check_array(y, ensure_2d=False, dtype="numeric"), warn=True)
        check_consistent_length(np.empty(self.n_samples_fit_), y)
        self._y = y.astype(np.float64)
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Predicted targets.

        Parameters
        ----------
        X : (m, d) array-like or DataFrame

        Returns
        -------
        (m,) ndarray of float64
        """
        check_is_fitted(self, "_y")
        if is_dask(X) or hasattr(self, "_dask_refs"):
            from densitas.neighbors.dask import estimator_predict

            return estimator_predict(self, X, "regress")
        if self.weights == "uniform":
            ind = self.kneighbors(X, return_distance=False)
            return predict_values(self._y, ind, None)
        dist, ind = self.kneighbors(X)
        w = get_weights(dist, self.weights)
        return predict_values(self._y, ind, w)
