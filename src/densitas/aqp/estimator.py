"""The model-assisted regression estimator that turns a synopsis' model and its sample into honest answers.

A query asks, per synopsis group ``g`` (a stratum of ``N_g`` rows of which ``n_g`` are a simple random sample),
for a total ``T_g = Σ_rows y`` (``y = 1_B(x)`` for COUNT, ``v·1_B(x)`` for SUM). The synopsis supplies
*auxiliary* functions ``z_a(x)`` of a row whose population totals ``Z_a`` it knows **exactly** (functions of one
column's fine bin, of a stored pair grid's cells, of a sum grid's cells — each built from the model's own
prediction for the query); column 0 is the model's prediction itself.

The estimate is the generalized regression (GREG) estimator of Särndal, Swensson & Wretman, *Model Assisted
Survey Sampling* (Springer 1992), §6.4–6.6 and eq. (6.6.9)::

    T̂_g = Σ_a β̂_a Z_a + (N_g / n_g) · Σ_{i ∈ s_g} e_i,        e_i = y_i − Σ_a β̂_a z_a(x_i)

with ``β̂`` the least-squares fit of ``y`` on ``(1, z)`` among the group's sample rows (as a correction to the
model's own prediction with weight 1). Whatever the model, ``T̂_g`` is design-consistent for ``T_g`` and its
variance is estimated from the residuals,

    V̂_g = N_g² (1 − n_g / N_g) / n_g · Σ_{i∈s_g} (e_i − ē)² / (n_g − p),

so a model that misses dependence (three-way interactions, functional dependence, small groups) widens the
interval instead of biasing the answer: the model only decides how small the residuals are. With the whole
group as the sample (``n_g = N_g``) the answer is exact and the variance vanishes.

A query's box leaves most sample rows with ``y = 0`` and every auxiliary 0; such a row enters the fit only
through the intercept, and its residual is the same for every such row of a group. The caller may therefore
pass only the rows where something is non-zero (any superset of them): the ``n_g`` of ``n`` minus the rows
given are these *outside* rows, and their sums enter in closed form (:attr:`GroupTotals.outside`).

A direction of a group's fit carried by less than one row's worth of its sample (:data:`MIN_INFORMATION`) is
left out of the estimate: the fit along it rests on the one or two rows that carry it, reproduces their
residuals and extrapolates to the population totals with nothing in the sample to check it. What it would add,
``(β̂_all − β̂)ᵀ (Z − Ẑ_HT)`` (the fit with every direction against the fit without, ``Ẑ_HT`` the sample's
expansion estimate of the totals ``Z``), is added to the variance at its full size
(:attr:`GroupTotals.extrapolation`): the sample can neither confirm nor rule it out, so the interval holds both
answers. This is a sensitivity term in the spirit of the model-error terms of model-assisted estimation, not a
variance the design estimates. That shift is ``Σ_i a_i e_i`` over the rows that carry those directions, so its
own noise enters the variance as well, by the sandwich ``Σ_i (a_i e_i)²`` (:meth:`GroupTotals.extrapolation_noise`).

Groups whose sample is too small for every term (fewer than ``MIN_ROWS_PER_TERM`` rows per term) fit only an
intercept and the model's own prediction (the simple regression estimator, ibid. §6.5); groups too small even
for that use the difference estimator with the model's prediction (``β`` fixed, ibid. §6.3), which is unbiased
for any model.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Auxiliaries", "GroupTotals", "regression_totals", "scratch"]

# the regression needs this many sample rows per fitted coefficient, else the difference estimator is used
MIN_ROWS_PER_TERM = 10
# residuals for the variance are leave-one-out residuals e/(1 − h) (the jackknife / HC3 form), h capped here
LEAVE_ONE_OUT = True
MAX_LEVERAGE = 0.9
# residuals for the variance are scaled by each row's g-weight (the g-weighted variance estimator)
G_WEIGHTS = True
# a direction of a group's fit carrying less than this many rows' worth of its data (eigenvalue of the terms'
# unit-diagonal cross-product matrix below this / n_g of the largest) is not fitted: nearly collinear terms took
# huge opposite weights there (births SUM(year) 21% off inside ±1.3%). One row: a unit, not a fitted number;
# checked on the tuning tables (synthetic 2.03% -> 1.86% mean, fertility and lineitem unchanged). What such a
# direction would add counts in the variance (GroupTotals.extrapolation): left out, 39 unsampled rows carrying
# one put a population SUM 31.7 M off inside ±2.8 M (a query class covering 59% of the time)
MIN_INFORMATION = 1.0
# up to this many groups with rows in the fit, per-group sums are one slice sum per group (else bincounts)
FEW_GROUPS = 32
# up to this many, the cross products and per-row forms are one matrix product per group; beyond, a gather of
# each row's group matrix (O(m·p²) memory traffic). The products won at every size measured, median latency:
# flights (35 groups) 16.6 -> 5.6 ms, births (357) 44.1 -> 23.1 ms, 1,000 groups of 200 sample rows 192 -> 86 ms
# (benchmarks/aqp_groups.py; benchmarks/RESULTS.md, "AQP after the new-user review")
PRODUCT_GROUPS = 1024
# sparse terms (non-zero on a few rows) are kept apart from this many rows given on; below, as dense rows
SPARSE_FROM_ROWS = 8192
# relative eigenvalue below which a direction of a group's fit is dropped: √(float64 ε), numerical, not fitted
RCOND = float(np.sqrt(np.finfo(np.float64).eps))


class _Workspace(threading.local):
    """Per thread, memory kept from one query to the next for the per-row arrays that do not outlive a query.
    Fresh arrays of this size (hundreds of kB) come from the allocator as new pages, each one a page fault on
    first touch: hundreds per three-column query, up to a third of its time on a busy machine."""

    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape``, valid until this thread asks for ``name`` again."""
        size = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or len(buf) < size:
            buf = self.buffers[name] = np.empty(max(size, 1))
        return buf[:size].reshape(shape)


_WORK = _Workspace()


def scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised float64 array of ``shape`` in memory this thread keeps for its next query: valid until
    the thread asks for ``name`` again (a query's designs, say).

    Examples
    --------
    >>> a = scratch("example", (2, 3))
    >>> a.shape, a.flags.c_contiguous
    ((2, 3), True)
    """
    return _WORK.get(name, shape)


class Auxiliaries:
    """For one key: sample-row values ``rows`` (n, A) and exact population totals ``totals`` (G, A) of the
    auxiliary functions; column 0 is the model's own prediction (the difference estimator's ``m``).

    Held term by term: ``terms`` (A_d, n) the dense ones, then ``sparse``, a list of ``(positions, values)``
    for terms that vanish on all rows but a few (their totals follow the dense terms' in ``totals``).
    :meth:`from_terms` builds one from that layout without a copy.

    Examples
    --------
    >>> import numpy as np
    >>> aux = Auxiliaries(rows=np.array([[0.5], [1.0], [0.0]]), totals=np.array([[40.0]]))
    >>> aux.rows.shape, aux.terms.shape, aux.totals.shape
    ((3, 1), (1, 3), (1, 1))
    """

    def __init__(self, rows: np.ndarray, totals: np.ndarray) -> None:
        self.terms = np.ascontiguousarray(np.asarray(rows, dtype=np.float64).T)
        self.sparse: list[tuple[np.ndarray, np.ndarray]] = []
        self.totals = np.asarray(totals, dtype=np.float64)
        self.design: np.ndarray | None = None  # the intercept row and the terms, when built that way

    @classmethod
    def from_terms(cls, terms: np.ndarray, totals: np.ndarray,
                   sparse: list[tuple[np.ndarray, np.ndarray]] | None = None) -> Auxiliaries:
        """From the values term by term: ``terms`` (A_d, n) dense (kept, not copied), ``sparse`` a list of
        ``(positions, values)`` of terms that are 0 on every other row.

        Examples
        --------
        >>> import numpy as np
        >>> aux = Auxiliaries.from_terms(np.ones((1, 4)), np.zeros((1, 2)), [(np.array([2]), np.array([5.0]))])
        >>> aux.rows.tolist()
        [[1.0, 0.0], [1.0, 0.0], [1.0, 5.0], [1.0, 0.0]]
        """
        aux = cls.__new__(cls)
        aux.terms, aux.totals = terms, np.asarray(totals, dtype=np.float64)
        aux.sparse = list(sparse or [])
        aux.design = None
        return aux

    @classmethod
    def from_design(cls, design: np.ndarray, totals: np.ndarray,
                    sparse: list[tuple[np.ndarray, np.ndarray]] | None = None) -> Auxiliaries:
        """As :meth:`from_terms`, from ``design`` (1 + A_d, n) whose row 0 is all ones (the fit's intercept) and
        whose other rows are the dense terms: the fit uses it as it is.

        Examples
        --------
        >>> import numpy as np
        >>> aux = Auxiliaries.from_design(np.array([[1.0, 1.0], [0.5, 2.0]]), np.zeros((1, 1)))
        >>> aux.rows.tolist()
        [[0.5], [2.0]]
        """
        aux = cls.from_terms(design[1:], totals, sparse)
        aux.design = design
        return aux

    @property
    def rows(self) -> np.ndarray:
        """(n, A): the values row by row (a view of :attr:`terms` when no term is sparse)."""
        if not self.sparse:
            return self.terms.T
        out = np.zeros((self.terms.shape[1], len(self.terms) + len(self.sparse)))
        out[:, :len(self.terms)] = self.terms.T
        for t, (pos, vals) in enumerate(self.sparse):
            out[pos, len(self.terms) + t] = vals
        return out


@dataclass
class GroupTotals:
    """Per synopsis group (G) and key (K): the answer and its parts, and the residuals behind its variance.

    ``value = model + correction``; ``model`` is ``Σ β̂_a Z_a`` (the calibrated model total), ``correction`` the
    sample's residual total. :meth:`sampling_variance` gives the variance of any linear combination of the keys.

    Examples
    --------
    >>> import numpy as np
    >>> aux = [Auxiliaries(rows=np.array([[1.0], [0.0], [1.0], [0.0]]), totals=np.array([[50.0]]))]
    >>> t = regression_totals(np.array([[1.0], [0.0], [1.0], [0.0]]), aux, np.zeros(4, dtype=int),
    ...                       np.array([100.0]), np.array([4.0]))
    >>> float(t.value[0, 0]), float(t.correction[0, 0])          # y equals the auxiliary: its exact total
    (50.0, 0.0)
    """

    value: np.ndarray  # (G, K)
    model: np.ndarray  # (G, K)
    correction: np.ndarray  # (G, K)
    residuals: np.ndarray  # (m, K) on the sample rows given
    gid: np.ndarray  # (m,) group of each sample row given
    N: np.ndarray  # (G,)
    n: np.ndarray  # (G,)
    df: np.ndarray  # (G, K) residual degrees of freedom
    outside: np.ndarray  # (G,) sample rows of the group not given (y and every auxiliary 0 there)
    outside_residual: np.ndarray  # (G, K) the residual each of them has
    residual_scatter: np.ndarray  # (G, K, K) Σ (r − r̄)(r − r̄)ᵀ over all the group's sample rows, key by key
    # (G, K) or None: what the answer would take from the fit directions under one row's worth of the group's
    # sample, which the estimate leaves out (MIN_INFORMATION); counted in the variance at its full size
    extrapolation: np.ndarray | None = None
    # (G, K, K) or None: per group, the keys' shifts' own scatter Σ u uᵀ (their coefficients are least squares
    # on the few rows that carry the directions); see extrapolation_noise
    shift_scatter: np.ndarray | None = None
    # (G, K) or None: the regression estimator's bias to first order, estimated from the sample (_regression_bias)
    bias: np.ndarray | None = None
    _expansion: np.ndarray | None = field(default=None, repr=False)

    def sampling_variance(self, gids: np.ndarray, ks: list[int], ws: list[np.ndarray | float]) -> np.ndarray:
        """(len(gids),): the estimated variance of ``Σ_k w_k T̂_k`` for each group of ``gids`` (weights scalar or
        one per group of ``gids``): ``N²(1 − n/N)/n`` times the sample variance of the combined residuals, plus
        the square of what the directions the fit leaves out would move it by (:meth:`extrapolation_variance`) and
        that shift's own noise (:meth:`extrapolation_noise`).

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> z = rng.uniform(size=(200, 1)); y = (z[:, 0] > 0.5) * 1.0         # y is not linear in z
        >>> t = regression_totals(y[:, None], [Auxiliaries(z, np.array([[500.0]]))], np.zeros(200, dtype=int),
        ...                       np.array([1000.0]), np.array([200.0]))
        >>> v = t.sampling_variance(np.array([0]), [0], [1.0])
        >>> bool(0 < v[0] < 1000.0 ** 2 * 0.25 / 200)                       # below the plain sample's variance
        True
        """
        W = np.zeros((len(gids), self.residual_scatter.shape[1]))  # each key's weight in each answered group
        for k, w in zip(ks, ws, strict=True):
            W[:, k] += w
        return self.variance_of(gids, W, ks)

    def variance_of(self, gids: np.ndarray, W: np.ndarray, ks: list[int]) -> np.ndarray:
        """(len(gids),): as :meth:`sampling_variance`, with the weights as a (len(gids), K) matrix ``W`` (0 for the
        keys not among ``ks``).

        Examples
        --------
        >>> import numpy as np
        >>> t = regression_totals(np.array([[1.0], [0.0], [1.0]]), [Auxiliaries(np.ones((3, 1)), np.array([[9.0]]))],
        ...                       np.zeros(3, dtype=int), np.array([9.0]), np.array([3.0]))
        >>> v = t.variance_of(np.array([0]), np.array([[1.0]]), [0])
        >>> bool(v[0] == t.sampling_variance(np.array([0]), [0], [1.0])[0])
        True
        """
        ss = np.einsum("gk,gkl,gl->g", W, self.residual_scatter[gids], W)  # of the combined residuals
        return (self.residual_variance(gids, ss, ks) + self.extrapolation_noise(gids, W)
                + self.extrapolation_variance(gids, W))

    def extrapolation_noise(self, gids: np.ndarray, W: np.ndarray) -> np.ndarray:
        """(len(gids),): per group, the variance of the shift :meth:`extrapolation_shift` itself, for the
        combination ``W`` (len(gids), K) of the keys; 0 where the fit dropped no direction.

        The fit with every direction takes its coefficients along the dropped ones from the few rows that carry
        them: it exceeds the estimate's by ``Δ Xᵀe`` (``Δ`` the part of ``(XᵀX)⁺`` along those directions, ``e``
        the estimate's residuals), so the shift is ``Σ_i a_i e_i`` with ``a_i = x_iᵀ Δ (Z − Ẑ_HT)``, and it moves
        with those rows' errors. The interval that holds the full fit's answer must hold that noise too: its
        sandwich variance ``Σ_i (Σ_k w_k a_ik e_ik)²`` (White 1980), each row's own residual standing for its
        error, so that rows fitting the direction closely (an exact grid's answer) add nothing. The groups'
        samples are independent: an answer over several sums their variances.

        Deliberately conservative: the estimate's error along those directions is their true contribution ``b``
        (which the sample cannot check), and ``E[D²] = b² + Var(D)`` already, so ``D² + V̂(D)`` averages ``b² +
        2 Var(D)``: an upper allowance for ``b²`` given one noisy ``D`` (``D²`` alone fell short of ``b²`` in a
        quarter of the samples of a generated case, covering 80%).

        Examples
        --------
        >>> import numpy as np
        >>> t = GroupTotals(*[np.zeros((1, 1))] * 3, np.zeros((0, 1)), np.zeros(0, dtype=int), np.ones(1),
        ...                 np.ones(1), np.ones((1, 1)), np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1, 1)),
        ...                 extrapolation=np.array([[3.0]]), shift_scatter=np.array([[[5.0]]]))
        >>> t.extrapolation_noise(np.array([0]), np.array([[2.0]])).tolist()   # 2² · 5
        [20.0]
        """
        if self.shift_scatter is None:
            return np.zeros(len(gids))
        return np.maximum(np.einsum("gk,gkl,gl->g", W, self.shift_scatter[gids], W), 0.0)

    def extrapolation_variance(self, gids: np.ndarray, W: np.ndarray) -> np.ndarray:
        """(len(gids),): per group, the square of what the combination ``W`` (len(gids), K) of the keys' totals
        would change by if the fit also took the directions under one row's worth of the group's sample
        (:meth:`extrapolation_shift`); 0 where it dropped none. An answer over several groups squares the sum of
        their shifts instead.

        The estimate leaves such a direction out: along it, the fit would rest on the one or two rows that
        carry it, whose residuals it then reproduces, so the sample holds no evidence for or against what it
        would add (leaving out a row that carries it leaves the direction without data). Taking the difference
        as a possible error of its full size keeps the interval around both answers: the one the sample
        supports and the one the dropped directions would give.

        Examples
        --------
        >>> import numpy as np
        >>> t = GroupTotals(*[np.zeros((1, 1))] * 3, np.zeros((0, 1)), np.zeros(0, dtype=int), np.ones(1),
        ...                 np.ones(1), np.ones((1, 1)), np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1, 1)),
        ...                 extrapolation=np.array([[3.0]]))
        >>> t.extrapolation_variance(np.array([0]), np.array([[2.0]])).tolist()   # (2·3)²
        [36.0]
        """
        shift = self.extrapolation_shift(gids, W)
        return np.zeros(len(gids)) if shift is None else shift ** 2

    def extrapolation_shift(self, gids: np.ndarray, W: np.ndarray) -> np.ndarray | None:
        """(len(gids),) or None: what the combination ``W`` (len(gids), K) of each group's totals would change by
        if the fit also took the directions it leaves out (:attr:`extrapolation`), signed: an answer that adds up
        several groups changes by the sum, which its variance takes squared (not the sum of the squares: the
        groups' shifts are one fit's choice, not independent errors). None where no direction was left out.

        Examples
        --------
        >>> import numpy as np
        >>> t = GroupTotals(*[np.zeros((2, 1))] * 3, np.zeros((0, 1)), np.zeros(0, dtype=int), np.ones(2),
        ...                 np.ones(2), np.ones((2, 1)), np.zeros(2), np.zeros((2, 1)), np.zeros((2, 1, 1)),
        ...                 extrapolation=np.array([[3.0], [-1.0]]))
        >>> t.extrapolation_shift(np.array([0, 1]), np.ones((2, 1))).tolist()
        [3.0, -1.0]
        """
        if self.extrapolation is None:
            return None
        return np.einsum("gk,gk->g", W, self.extrapolation[gids])

    def bias_shift(self, gids: np.ndarray, W: np.ndarray) -> np.ndarray | None:
        """(len(gids),) or None: per group, the first-order bias of ``Σ_k W_k T̂_k`` (:attr:`bias`), signed: an
        answer over several groups adds them up before it is squared (:class:`~densitas.aqp.synopsis.GroupVariances`).

        Examples
        --------
        >>> import numpy as np
        >>> t = GroupTotals(*[np.zeros((1, 1))] * 4, np.zeros(1, dtype=int), *[np.ones(1)] * 3, np.zeros(1),
        ...                 np.zeros((1, 1)), np.zeros((1, 1, 1)), bias=np.array([[2.0]]))
        >>> t.bias_shift(np.array([0]), np.array([[3.0]])).tolist()
        [6.0]
        """
        if self.bias is None:
            return None
        return np.einsum("gk,gk->g", W, self.bias[gids])

    def residual_variance(self, gids: np.ndarray, ss: np.ndarray, ks: list[int]) -> np.ndarray:
        """(len(gids),): the variance of an expanded total whose combined residuals (of the keys ``ks``) have
        the sum of squared deviations ``ss`` over each group's sample rows: ``N²(1 − n/N)/n · ss/df``.

        Examples
        --------
        >>> import numpy as np
        >>> t = regression_totals(np.array([[1.0], [0.0], [1.0]]), [Auxiliaries(np.ones((3, 1)), np.array([[9.0]]))],
        ...                       np.zeros(3, dtype=int), np.array([9.0]), np.array([3.0]))
        >>> round(float(t.residual_variance(np.array([0]), np.array([2.0]), [0])[0]), 9)  # 9²·(1 − 3/9)/3 · 2/2
        18.0
        """
        df = self.df[gids][:, ks].min(axis=1)
        s2e = np.where(df > 0, ss / np.maximum(df, 1), 0.0)
        return self.expansion[gids] * np.maximum(s2e, 0.0)

    @property
    def expansion(self) -> np.ndarray:
        """(G,): ``N²(1 − n/N)/n`` per group (0 where nothing is sampled): the variance of an expanded total per
        unit of its rows' variance."""
        if self._expansion is None:
            N, n = self.N, self.n
            with np.errstate(invalid="ignore", divide="ignore"):
                self._expansion = np.where(n > 0, N * N * np.clip(1 - n / np.maximum(N, 1), 0.0, 1.0)
                                           / np.maximum(n, 1), 0.0)
        return self._expansion


def regression_totals(y: np.ndarray, aux: list[Auxiliaries], gid: np.ndarray, N: np.ndarray,
                      n: np.ndarray) -> GroupTotals:
    """GREG totals per group for every key.

    Parameters
    ----------
    y : ndarray of shape (m, K)
        The target of each key on the sample rows given (``y·1_B``).
    aux : list of Auxiliaries
        One per key.
    gid : ndarray of shape (m,)
        The synopsis group of each sample row given.
    N, n : ndarray of shape (G,)
        Rows and sample rows per group. Sample rows not given (``n`` minus the rows given per group) are rows
        where ``y`` and every auxiliary are 0.

    Returns
    -------
    GroupTotals

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.uniform(size=1000); y = 2 * x + 1           # y is linear in an auxiliary with a known total
    >>> s = rng.choice(1000, 100, replace=False)
    >>> aux = [Auxiliaries(rows=x[s, None], totals=np.array([[x.sum()]]))]
    >>> t = regression_totals(y[s, None], aux, np.zeros(100, dtype=int), np.array([1000.0]), np.array([100.0]))
    >>> bool(np.isclose(t.value[0, 0], y.sum()))
    True
    """
    gid = np.asarray(gid)
    order = None
    if np.any(gid[1:] < gid[:-1]):  # the rows of a group contiguous; answered in the caller's order
        order = np.argsort(gid, kind="stable")
        gid, y = gid[order], y[order]
        aux = [Auxiliaries(a.rows[order], a.totals) for a in aux]
    G, K = len(N), y.shape[1]
    sparse_from = [1 + len(a.terms) for a in aux]  # each key's first sparse term in its design (0: the intercept)
    rg = _RowGroups(gid, G)
    stack = _Stack.of(aux, rg) if K else None
    X = stack.designs if stack is not None else [_Design(a, rg) for a in aux]
    p = np.array([x.p for x in X])  # terms per key (the fit's arrays are padded to the most)
    P = int(p.max()) if K else 1
    Xt = np.zeros((K, G, P))  # per key and group the terms' population totals, the intercept's N_g first
    Xt[:, :, 0] = N
    for k in range(K):
        Xt[k, :, 1:p[k]] = aux[k].totals
    m = len(gid)
    yT = y.T  # (K, m): each key's target contiguous
    if not yT.flags.c_contiguous:
        yT = _WORK.get("y", (K, m))
        yT[:] = y.T
    # the fit corrects the difference estimator (the model's own prediction, column 0 of Z, with β = 1): the
    # smallest correction that fits, so terms collinear among the sample rows but not in the table (every
    # sampled row inside the box, say) keep the model's own weights instead of splitting them arbitrarily
    if stack is not None:  # every key's prediction is row 1 of its block
        np.subtract(yT, stack.block[:, 1], out=stack.targets)
        yk = stack.targets
    else:
        yk = _WORK.get("yk", (K, m))
        for k, x in enumerate(X):
            np.subtract(yT[k], x.dense[1], out=yk[k])
    xtx, xty = stack.normal_equations(n) if stack is not None else _normal_equations(X, yk, n, P)
    # too few rows for every term: the model's prediction and an intercept only (the first two terms' equations)
    small = (n < MIN_ROWS_PER_TERM * p[:, None]) & (p[:, None] > 2)
    two = _solve(xtx[..., :2, :2].copy(), xty[..., :2].copy(), n, X) if small.any() else None
    tiny = n < MIN_ROWS_PER_TERM * 2  # too few rows even for that: the difference estimator alone
    # a sparse term (a cut bin's position term: sparse_from on in each key's design) non-zero on fewer than
    # MIN_ROWS_PER_TERM of a group's sample rows is not fitted there, as a group with too few rows per term fits
    # none: one seen on a single row took a coefficient that moved a COUNT under one bound 231 rows off (1.6%)
    # inside a ±7 interval, its total from the bin's exact sum against that one row's. The dense terms (the
    # model's predictions and sums) stay: seen on a few rows they may fit them exactly (a discrete value's SUM)
    dropped = _unsupported_terms(~small & ~tiny[None, :], X, rg, xty.shape[2], sparse_from)
    fit = _solve(xtx, xty, n, X, drop=dropped if dropped.any() else None)
    lev = _WORK.get("lev", (K, m))
    while True:
        beta, ginv = _coefficients(fit, two, small, tiny)
        # each row's leverage h = xᵀ(XᵀX)⁺x in its group's fit (an outside row's, x = (1, 0, …, 0), is
        # (XᵀX)⁺₀₀), its residual e = y − xᵀβ (an outside row's −β₀) and, for the variance, its g-weight
        c = _g_coefficients(Xt, ginv, fit.xsum, N, n)
        # and, where the fit left directions out, a = xᵀ Δ gap: the shift they would add is Σ a e (_shift)
        pull = _dropped_pull(fit.ginv_dropped, Xt, fit.xsum, N, n)
        W = np.stack([beta, c] if pull is None else [beta, c, pull], axis=2)  # (K, G, 2 or 3, P)
        forms = _WORK.get("forms", (K, W.shape[2], m))
        if stack is not None:
            stack.forms(ginv, W, lev, forms)
        else:
            for k in range(K):
                X[k].forms(ginv[k, :, :p[k], :p[k]], W[k, :, :, :p[k]], lev[k], forms[k])
        # a term non-zero on fewer than MIN_ROWS_PER_TERM of a group's sample rows is not fitted there: a term seen
        # on one row, whose model total was hundreds of times what that row suggests, took a coefficient that
        # put the answer 4× off inside a narrow interval (flights). Such a fit calibrates with negative weights
        # (g < 0), so the rows are counted only where some g is negative, and the fit is redone without them
        bad = _negative_weights(forms[:, 1], c[..., 0], rg, n) & ~small & ~tiny
        drop = _unsupported_terms(bad, X, rg, dropped.shape[2]) & ~dropped if bad.any() else None
        if drop is None or not drop.any():
            break
        dropped |= drop  # the normal equations again (_solve modified them): rare, so not kept
        xtx, xty = stack.normal_equations(n) if stack is not None else _normal_equations(X, yk, n, P)
        fit = _solve(xtx, xty, n, X, drop=dropped)
    e = np.subtract(yT, forms[:, 0], out=_WORK.get("e", (K, m)))
    e0 = -beta[..., 0]  # (K, G)
    outside = n - rg.rows  # rows with X = (1, 0, …, 0) and y = 0
    e_sums = rg.sums(e) + outside[:, None] * e0.T  # (G, K)
    # each residual as if its row had been left out of the fit (e/(1 − h), h its leverage): for the variance, a fit
    # with many terms on few rows otherwise shrinks the residuals and the interval with them; and for the bias
    loo, loo0 = np.divide(e, _one_minus_capped(lev)), e0 / _one_minus_capped(ginv[..., 0, 0].copy())
    bias = _regression_bias(rg.sums(loo) + outside[:, None] * loo0.T, e_sums, N, n)
    r, r0 = (loo, loo0) if LEAVE_ONE_OUT else (e.copy(), e0)
    if G_WEIGHTS:  # times each row's calibration weight g (ibid. eq. 6.6.10): a fit that moves the sample far to
        # reach the population totals (Z − HT large along weakly sampled directions) widens the interval
        forms[:, 1] += 1.0
        r *= forms[:, 1]
        r0 = r0 * (1.0 + c[..., 0])
    model = (Xt * beta).sum(axis=2).T  # (G, K)
    extrapolation, shift_scatter = (None, None) if pull is None else \
        _shift(forms[:, 2], e, pull[..., 0], e0, rg, outside)
    corr = (N / np.maximum(n, 1))[:, None] * e_sums
    value = model + corr
    if LEAVE_ONE_OUT:
        dfs = np.repeat((n - 1.0)[:, None], K, axis=1)
    else:
        dfs = np.where(tiny[:, None], n[:, None] - 1, np.where(small.T, n[:, None] - 2, n[:, None] - p))
    resid, resid0 = r.T, r0.T  # (m, K), (G, K)
    scatter = _scatter(*rg.moments(resid), resid0, outside, n)
    if order is not None:
        resid[order] = resid.copy()
        gid = np.asarray(gid)[np.argsort(order)]
    return GroupTotals(value, model, corr, resid, gid, N.astype(np.float64), n.astype(np.float64),
                       np.maximum(dfs, 0.0), outside.astype(np.float64), resid0, scatter, extrapolation,
                       shift_scatter, bias)


def _regression_bias(loo_sums: np.ndarray, e_sums: np.ndarray, N: np.ndarray, n: np.ndarray) -> np.ndarray:
    """(G, K): per group and key, the regression estimator's bias to first order, estimated from the sample,
    ``−(1 − n/N)(N/n) Σ_i h_i e_i/(1 − h_i)`` over the group's sample rows (``e`` the residuals, ``h`` the
    leverages in the group's fit, capped at :data:`MAX_LEVERAGE`), from the sums per group of the left-out
    residuals ``e_i/(1 − h_i)`` (``loo_sums``) and of the residuals (``e_sums``): ``h e/(1 − h) = e/(1 − h) − e``.

    The estimate is ``T̂ = Ŷ + β̂ᵀ(Z − Ẑ)``; its error less the residuals' expansion is ``−(β̂ − B)ᵀ(Ẑ − Z)``, and
    the two factors are correlated through the rows far from the sample's mean of the terms: under simple random
    sampling ``E ≈ ((1 − f)/n) Σ_U E_i d_i`` with ``d_i = (x_i − x̄)ᵀ S⁻¹ (x_i − x̄)`` (Cochran, *Sampling
    Techniques*, 3rd ed., Wiley 1977, §7.7 for one term; the same argument with ``S`` a matrix), and among the
    sample rows ``d_i = n h_i − 1``; ``E_i`` is taken from the row's residual left out of the fit, ``e_i/(1 − h_i)``
    (the fit's own residuals are shrunk exactly at the far rows: with them the estimate was half the bias a Monte
    Carlo showed, with these within 10%, tests/aqp/test_regression_bias.py). It is ``O(1/n)`` of the total,
    against a standard error ``O(1/√n)``: nothing in one group, but the groups' biases share a sign where their
    fits share a shape, and an answer over hundreds of groups adds them up (births' ``SUM(month) WHERE year >=
    1980``, 357 groups: 5,027 over inside ±3,472 in one build, 4.0 standard errors in another). A group fitted
    with the model's prediction alone (the difference estimator, leverage 0) or sampled whole has none.

    Examples
    --------
    >>> e, h = np.array([1.0, -1.0, 0.0]), np.array([0.5, 0.1, 0.2])   # three rows, one group and key
    >>> loo = (e / (1 - h)).sum()
    >>> _regression_bias(np.array([[loo]]), np.array([[e.sum()]]), np.array([30.0]), np.array([3.0])).round(6).tolist()
    [[-8.0]]
    """
    return -((1.0 - n / np.maximum(N, 1)) * N / np.maximum(n, 1))[:, None] * (loo_sums - e_sums)


def _dropped_pull(ginv_dropped: np.ndarray | None, Xt: np.ndarray, xsum: np.ndarray, N: np.ndarray,
                  n: np.ndarray) -> np.ndarray | None:
    """(K, G, P) or None: per key and group ``Δ gap``, ``gap = Z − (N/n) Σ_s x`` (the terms' exact totals less the
    sample's estimate of them) and ``Δ`` the part of ``(XᵀX)⁺`` along the directions :data:`MIN_INFORMATION`
    drops. The fit with every direction has coefficients ``β̂ + Δ Xᵀe`` (``e`` the estimate's residuals: both
    pseudo-inverses come from one eigendecomposition of ``XᵀX``), and its answer less the estimate is
    ``(ΔXᵀe)ᵀ gap = Σ_i a_i e_i`` with ``a_i = x_iᵀ Δ gap`` (:func:`_shift`). None where no direction was
    dropped."""
    if ginv_dropped is None:
        return None
    gap = Xt - (N / np.maximum(n, 1))[:, None] * xsum
    return _finite_or_zero(np.einsum("kgpq,kgq->kgp", ginv_dropped, gap))


def _shift(a: np.ndarray, e: np.ndarray, a0: np.ndarray, e0: np.ndarray, rg: _RowGroups,
           outside: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group, with ``u_ik = a_ik e_ik`` over its sample rows (the given rows' ``a``, ``e`` (K, m); the
    ``outside`` rows' ``a0``, ``e0`` (K, G)): the shift ``Σ_i u_i`` (G, K), what the fit with every direction
    would add to the estimate (:attr:`GroupTotals.extrapolation`), and ``Σ_i u_i u_iᵀ`` (G, K, K), its variance
    as the sandwich (heteroscedasticity-consistent) estimator gives it, each row's own residual standing for
    its error (White 1980; :attr:`GroupTotals.shift_scatter`). Rows that carry a dropped direction but fit it
    closely add little to either."""
    total, cross = rg.moments((a * e).T)
    u0 = (a0 * e0).T  # (G, K)
    shift = total + outside[:, None] * u0
    return _finite_or_zero(shift), cross + outside[:, None, None] * (u0[:, :, None] * u0[:, None, :])


def _scatter(r_sum: np.ndarray, r_cross: np.ndarray, r0: np.ndarray, outside: np.ndarray,
             n: np.ndarray) -> np.ndarray:
    """(G, K, K): per group the scatter matrix ``Σ (r − r̄)(r − r̄)ᵀ`` of the keys' residuals over its ``n`` sample
    rows, from the given rows' sums ``r_sum`` (G, K) and cross products ``r_cross`` (G, K, K) and the ``outside``
    rows' residual ``r0`` (G, K)."""
    s = r_sum + outside[:, None] * r0
    return (r_cross + outside[:, None, None] * (r0[:, :, None] * r0[:, None, :])
            - s[:, :, None] * s[:, None, :] / np.maximum(n, 1)[:, None, None])


class _RowGroups:
    """The given sample rows, sorted by group, and the per-group sums and per-row forms the fit needs: one
    matrix product per group unless the groups are very many (:data:`PRODUCT_GROUPS`), else row-wise gathers;
    sums per group's slice when they are few (:data:`FEW_GROUPS`), else bincounts."""

    def __init__(self, gid: np.ndarray, G: int) -> None:
        self.gid, self.G = gid, G
        bounds = np.searchsorted(gid, np.arange(G + 1))  # group g's rows: bounds[g]:bounds[g + 1]
        self.rows = np.diff(bounds)
        present = np.flatnonzero(self.rows)
        self.present = present  # the groups with rows, in order
        self.first = bounds[present]  # where each non-empty group's rows start
        self.few = len(present) <= FEW_GROUPS
        self.products = len(present) <= PRODUCT_GROUPS
        self.slices = list(zip(present.tolist(), self.first.tolist(), bounds[present + 1].tolist(), strict=True))

    def gram(self, LT: np.ndarray, XT: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group ``Σ l xᵀ`` (G, q, p) and ``Σ l y`` (G, q) over its rows, for the terms ``LT`` (q, m) and
        ``XT`` (p, m)."""
        q, p = LT.shape[0], XT.shape[0]
        xtx, xty = np.zeros((self.G, q, p)), np.zeros((self.G, q))
        if self.products:
            for g, a, b in self.slices:
                xtx[g] = LT[:, a:b] @ XT[:, a:b].T
                xty[g] = LT[:, a:b] @ y[a:b]
        elif len(self.gid):  # many groups: one segmented reduction of the outer products of the active rows
            # rows where every term but the intercept and y vanish add to the intercept's count only
            act = np.flatnonzero((XT[1:] != 0).any(axis=0) | (y != 0))
            ga = self.gid[act]
            first = np.flatnonzero(np.diff(ga, prepend=-1))
            La, Xa, ya = LT[:, act].T, XT[:, act].T, y[act]
            if len(act):
                xtx[ga[first]] = np.add.reduceat(La[:, :, None] * Xa[:, None, :], first, axis=0)
                xty[ga[first]] = np.add.reduceat(La * ya[:, None], first, axis=0)
        return xtx, xty

    def sums(self, e: np.ndarray) -> np.ndarray:
        """(G, K): each row of ``e`` (K, m) summed over each group's rows."""
        out = np.zeros((self.G, len(e)))
        if self.few:
            for g, a, b in self.slices:
                out[g] = e[:, a:b].sum(axis=1)
        else:
            for k in range(len(e)):
                out[:, k] = np.bincount(self.gid, e[k], minlength=self.G)
        return out

    def moments(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group the sums (G, K) of the columns of ``r`` (m, K) over its rows, and of their products
        (G, K, K)."""
        G, K = self.G, r.shape[1]
        s, cross = np.zeros((G, K)), np.zeros((G, K, K))
        if self.few:
            for g, a, b in self.slices:
                s[g] = r[a:b].sum(axis=0)
                cross[g] = r[a:b].T @ r[a:b]
            return s, cross
        for k in range(K):
            s[:, k] = np.bincount(self.gid, r[:, k], minlength=G)
            for k2 in range(k, K):
                cross[:, k, k2] = cross[:, k2, k] = np.bincount(self.gid, r[:, k] * r[:, k2], minlength=G)
        return s, cross

    def linear(self, XT: np.ndarray, W: np.ndarray) -> np.ndarray:
        """(r, m): ``W[g_i] @ x_i`` for each row ``i`` of group ``g_i``; ``W`` is (G, r, p)."""
        out = np.empty((W.shape[1], len(self.gid)))
        if self.products:
            for g, a, b in self.slices:
                out[:, a:b] = W[g] @ XT[:, a:b]
        else:
            out[:] = np.einsum("irp,pi->ri", W[self.gid], XT)
        return out

    def forms(self, XT: np.ndarray, Q: np.ndarray, W: np.ndarray, quad: np.ndarray, lin: np.ndarray) -> None:
        """:meth:`quadratic` and :meth:`linear` from one product per group, written into ``quad`` (m,) and
        ``lin`` (r, m): ``x_iᵀ Q[g_i] x_i`` and ``W[g_i] @ x_i``."""
        if not self.products:
            quad[:], lin[:] = self.quadratic(XT, Q), self.linear(XT, W)
            return
        p = Q.shape[1]
        M = np.concatenate([Q, W], axis=1)  # (G, p + r, p)
        work = _WORK.get("forms_z", (M.shape[1] * max(b - a for _, a, b in self.slices),)) if self.slices else None
        for g, a, b in self.slices:
            Z = np.matmul(M[g], XT[:, a:b], out=work[:M.shape[1] * (b - a)].reshape(M.shape[1], b - a))
            np.einsum("ij,ij->j", Z[:p], XT[:, a:b], out=quad[a:b])
            lin[:, a:b] = Z[p:]

    def quadratic(self, XT: np.ndarray, Q: np.ndarray) -> np.ndarray:
        """(m,): ``x_iᵀ Q[g_i] x_i`` for each row ``i`` of group ``g_i``; ``Q`` is (G, p, p)."""
        out = np.empty(len(self.gid))
        if self.products:
            for g, a, b in self.slices:
                out[a:b] = ((Q[g] @ XT[:, a:b]) * XT[:, a:b]).sum(axis=0)
        else:
            out[:] = np.einsum("pi,ipq,qi->i", XT, Q[self.gid], XT)
        return out


class _Design:
    """One key's fit terms on the given rows: the intercept and the dense terms on every row (``dense``, (d, m)),
    and the sparse terms, 0 except on a few rows ``U``; ``at_u`` (p, |U|) holds every term on those rows. The
    per-group sums and per-row forms of the fit (:meth:`gram`, :meth:`forms`) take the dense terms over all rows
    and the sparse ones over ``U`` only."""

    def __init__(self, aux: Auxiliaries | None, rg: _RowGroups, *, dense: np.ndarray | None = None) -> None:
        self.rg = rg
        if aux is None:  # dense terms only (head)
            self.dense, self.sparse = dense, []
        elif aux.design is not None:
            self.dense, self.sparse = aux.design, aux.sparse
        else:
            self.dense = np.empty((len(aux.terms) + 1, len(rg.gid)))
            self.dense[0] = 1.0  # intercept: total N_g
            self.dense[1:] = aux.terms
            self.sparse = aux.sparse
        if self.sparse and len(rg.gid) <= SPARSE_FROM_ROWS:  # few rows: the sparse terms as dense rows
            dense = np.zeros((len(self.dense) + len(self.sparse), len(rg.gid)))
            dense[:len(self.dense)] = self.dense
            for t, (pos, vals) in enumerate(self.sparse):
                dense[len(self.dense) + t, pos] = vals
            self.dense, self.sparse = dense, []
        self.d = len(self.dense)
        self.p = self.d + len(self.sparse)
        if self.sparse:
            self.u = np.unique(np.concatenate([pos for pos, _ in self.sparse]))
            self.at_u = np.zeros((self.p, len(self.u)))
            self.at_u[:self.d] = self.dense[:, self.u]
            for t, (pos, vals) in enumerate(self.sparse):
                self.at_u[self.d + t, np.searchsorted(self.u, pos)] = vals
            self.rg_u = _RowGroups(rg.gid[self.u], rg.G)

    def size(self) -> np.ndarray:
        """(p,): each term's largest magnitude over the given rows (1 for every term when no row is given)."""
        if not len(self.rg.gid):
            return np.ones(self.p)
        dense = np.maximum(self.dense.max(axis=1), -self.dense.min(axis=1))
        return np.concatenate([dense] + [[np.abs(v).max() if len(v) else 0.0] for _, v in self.sparse])

    def gram(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group ``Σ x xᵀ`` (G, p, p) and ``Σ x y`` (G, p) over its given rows."""
        d = self.d
        if not self.sparse:
            return self.rg.gram(self.dense, self.dense, y)
        xtx, xty = np.zeros((self.rg.G, self.p, self.p)), np.zeros((self.rg.G, self.p))
        xtx[:, :d, :d], xty[:, :d] = self.rg.gram(self.dense, self.dense, y)
        s_x, s_y = self.rg_u.gram(self.at_u[d:], self.at_u, y[self.u])  # the sparse terms vanish off U
        xtx[:, d:, :] = s_x
        xtx[:, :d, d:] = s_x[:, :, :d].transpose(0, 2, 1)
        xty[:, d:] = s_y
        return xtx, xty

    def forms(self, Q: np.ndarray, W: np.ndarray, quad: np.ndarray, lin: np.ndarray) -> None:
        """``x_iᵀ Q[g_i] x_i`` and ``W[g_i] @ x_i`` for each given row (``Q`` (G, p, p), ``W`` (G, r, p)), written
        into ``quad`` (m,) and ``lin`` (r, m): the leverages and the linear forms of the fit, from one product per
        group."""
        d = self.d
        self.rg.forms(self.dense, Q[:, :d, :d], W[:, :, :d], quad, lin)
        if self.sparse:
            q_u, l_u = np.empty(len(self.u)), np.empty((W.shape[1], len(self.u)))
            self.rg_u.forms(self.at_u, Q, W, q_u, l_u)
            quad[self.u], lin[:, self.u] = q_u, l_u


class _Stack:
    """Every key's design with every term dense, padded with zero terms to the most terms ``P`` and stacked
    (K, P + 1, m), each key's fit target (y minus the model's prediction) as row ``P``: with few groups, the
    per-group products of the fit are one batched product for all keys (:meth:`normal_equations`,
    :meth:`forms`). Used where no term is kept sparse (:data:`SPARSE_FROM_ROWS`)."""

    def __init__(self, block: np.ndarray, designs: list[_Design], rg: _RowGroups) -> None:
        self.block, self.designs, self.rg = block, designs, rg
        self.P = block.shape[1] - 1
        self.targets = block[:, self.P]  # (K, m), filled by the caller

    @classmethod
    def of(cls, aux: list[Auxiliaries], rg: _RowGroups) -> _Stack | None:
        """The stacked layout of the keys' terms ``aux`` on the rows of ``rg``, or None where the per-key layout
        applies (many groups, or sparse terms kept apart on many rows)."""
        m = len(rg.gid)
        if not rg.products or not m or (m > SPARSE_FROM_ROWS and any(a.sparse for a in aux)):
            return None
        dense = [a.design for a in aux]
        d = [len(a.terms) + 1 if x is None else len(x) for a, x in zip(aux, dense, strict=True)]
        p = [dk + len(a.sparse) for dk, a in zip(d, aux, strict=True)]
        P = max(p)
        block = _WORK.get("stack", (len(aux), P + 1, m))
        designs = []
        for k, a in enumerate(aux):
            if dense[k] is None:
                block[k, 0] = 1.0  # intercept: total N_g
                block[k, 1:d[k]] = a.terms
            else:
                block[k, :d[k]] = dense[k]
            block[k, d[k]:P] = 0.0
            for t, (pos, vals) in enumerate(a.sparse):
                block[k, d[k] + t, pos] = vals
            designs.append(_Design(None, rg, dense=block[k, :p[k]]))
        return cls(block, designs, rg)

    def normal_equations(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :func:`_normal_equations` for every key (its ``y`` the targets): one product per group gives
        ``Σ x xᵀ`` and ``Σ x y`` (the last column of the product of the design with its target row)."""
        K, P, G = len(self.block), self.P, self.rg.G
        xtx, xty = np.zeros((K, G, P, P)), np.zeros((K, G, P))
        for g, a, b in self.rg.slices:
            part = self.block[:, :, a:b]
            full = np.matmul(part, part.transpose(0, 2, 1))
            xtx[:, g], xty[:, g] = full[:, :P, :P], full[:, :P, P]
        xtx[:, :, 0, 0] = n
        return xtx, xty

    def forms(self, Q: np.ndarray, W: np.ndarray, quad: np.ndarray, lin: np.ndarray) -> None:
        """As :meth:`_Design.forms` for every key: ``Q`` (K, G, P, P), ``W`` (K, G, r, P), written into ``quad``
        (K, m) and ``lin`` (K, r, m); one product per group."""
        P = self.P
        M = np.concatenate([Q, W], axis=2)  # (K, G, P + r, P)
        rows = max(b - a for _, a, b in self.rg.slices)
        work = _WORK.get("stack_z", (len(M) * M.shape[2] * rows,))
        for g, a, b in self.rg.slices:
            x = self.block[:, :P, a:b]
            Z = np.matmul(M[:, g], x, out=work[:M.shape[0] * M.shape[2] * (b - a)].reshape(len(M), -1, b - a))
            np.einsum("kpj,kpj->kj", Z[:, :P], x, out=quad[:, a:b])
            lin[:, :, a:b] = Z[:, P:]


@dataclass
class _Fit:
    """Per-group least-squares fits (of one key, or of every key along a leading axis K): coefficients (G, p),
    ``(XᵀX)⁺`` in the terms' own units (G, p, p), and each term's sum over the group's sample rows (G, p)."""

    beta: np.ndarray
    ginv: np.ndarray
    xsum: np.ndarray
    # ``(XᵀX)⁺`` over the directions MIN_INFORMATION's cut dropped only (above √ε), in the terms' units; None
    # where it dropped none
    ginv_dropped: np.ndarray | None = None


def _g_coefficients(Xt: np.ndarray, ginv: np.ndarray, xsum: np.ndarray, N: np.ndarray,
                    n: np.ndarray) -> np.ndarray:
    """(G, p): per group the ``c`` of the GREG's g-weights ``g_i = 1 + x_iᵀ c``, ``c = (Σ_s (N/n) x xᵀ)⁻¹ (Z −
    Ẑ_HT)``, of each sample row in its group's fit (Särndal, Swensson & Wretman 1992, eq. 6.5.9): the estimate
    is ``Σ (N/n) g_i y_i``. ``xsum`` (G, p) holds the terms' sums over each group's sample rows
    (:attr:`_Fit.xsum`)."""
    w = (N / np.maximum(n, 1))[:, None]
    # a group of no rows (all of them stored whole: N = 0) has no sample and no weights
    return np.einsum("...gij,...gj->...gi", ginv, Xt - xsum * w) / np.where(w > 0, w, 1.0)


def _fit(X: _Design, y: np.ndarray, n: np.ndarray) -> _Fit:
    """Per-group minimum-norm least squares of ``y`` on the terms of ``X`` (one key): the coefficients (G, p) and
    ``(XᵀX)⁺`` (:func:`_solve`)."""
    xtx, xty = _normal_equations([X], y[None], n, X.p)
    fit = _solve(xtx, xty, n, [X])
    return _Fit(fit.beta[0], fit.ginv[0], fit.xsum[0])


def _normal_equations(X: list[_Design], y: np.ndarray, n: np.ndarray, P: int) -> tuple[np.ndarray, np.ndarray]:
    """Per key and group ``Σ x xᵀ`` (K, G, P, P) and ``Σ x y`` (K, G, P) over the group's rows (``y`` (K, m)), each
    key's terms first and zeros after. Rows outside every term's support and with ``y = 0`` (given or not: ``n``
    counts them) add only to the intercept's count: ``Σ 1 = n``."""
    G = len(n)
    xtx, xty = np.zeros((len(X), G, P, P)), np.zeros((len(X), G, P))
    for k, x in enumerate(X):
        xtx[k, :, :x.p, :x.p], xty[k, :, :x.p] = x.gram(y[k])
    xtx[:, :, 0, 0] = n
    return xtx, xty


def _solve(xtx: np.ndarray, xty: np.ndarray, n: np.ndarray, X: list[_Design], drop: np.ndarray | None = None
           ) -> _Fit:
    """Per key and group the minimum-norm least-squares solution of the normal equations ``xtx`` (K, G, q, q),
    ``xty`` (K, G, q) (modified), ``q`` the first terms of each key's design ``X[k]`` (zeros past its own):
    the coefficients (K, G, q), ``(XᵀX)⁺`` in the terms' own units (K, G, q, q) and each term's sum over the
    group's rows (K, G, q). Terms ``drop`` (K, G, q) are left out of the fit, as dead terms are."""
    K, G, q = xty.shape
    xsum = xtx[:, :, 0, :].copy()  # the intercept's row: each term's sum over the group's rows
    # a term whose values among a group's rows are round-off next to its size elsewhere (a position term
    # whose rows all sit at the middle of their bin, say) is no term there: rescaled, it would take any weight
    d = np.einsum("kgii->kgi", xtx)  # a view of the diagonals: it follows xtx
    dead = _dead_terms(X, d)
    if drop is not None:
        dead |= drop
    if dead.any():
        alive = ~dead
        xtx *= alive[..., :, None]
        xtx *= alive[..., None, :]
        xty *= alive
    # the minimum-norm least-squares solution (in units of each term's scale), group by group
    scale = np.sqrt(d)  # (sums of squares: d >= 0)
    scale[scale == 0] = 1.0
    A = xtx / scale[..., :, None] / scale[..., None, :]
    # directions below √ε (1.5e-8) of the largest eigenvalue are dropped: the normal equations square the terms'
    # condition number, so beyond it the solution is round-off, and terms almost collinear among a group's rows
    # took huge opposite weights that fit the sample exactly and extrapolated wildly to the population totals
    # (an answer 8% off with a ±0.1% interval on births with rcond 1e-10)
    rcond = np.maximum(RCOND, MIN_INFORMATION / np.maximum(n, 1))
    inv, dropped = _pinv_symmetric(A.reshape(K * G, q, q), np.tile(rcond, K), RCOND)
    inv = inv.reshape(K, G, q, q)
    beta = np.matmul(inv, (xty / scale)[..., None])[..., 0] / scale
    ginv = inv / scale[..., :, None] / scale[..., None, :]  # (XᵀX)⁺ in the terms' own units
    ginv_dropped = None  # along the directions MIN_INFORMATION drops: what the answer would take from them
    if dropped is not None:
        ginv_dropped = _finite_or_zero(dropped.reshape(K, G, q, q) / scale[..., :, None] / scale[..., None, :])
    return _Fit(_finite_or_zero(beta), _finite_or_zero(ginv), xsum, ginv_dropped)


def _coefficients(fit: _Fit, two: _Fit | None, small: np.ndarray, tiny: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The coefficients (K, G, P) and ``(XᵀX)⁺`` (K, G, P, P) of every key's and group's fit: the full fit, the
    two-term one (the model's prediction and the intercept) where ``small`` (K, G), none (the difference
    estimator) for the groups ``tiny`` (G,); the prediction's coefficient 1 plus its fitted correction. Written
    into ``fit``'s arrays (each fit is used once), ``fit.ginv_dropped`` (the part along the directions
    :data:`MIN_INFORMATION` drops) with the same choices."""
    ginv = fit.ginv
    if two is not None and small.any():
        ginv[small] = 0.0
        ginv[small, :2, :2] = two.ginv[small]
    ginv[:, tiny] = 0.0
    # the same choices for the dropped directions. A two-term fit may drop one where the full fit dropped none
    # above √ε (its near-null direction lies below √ε: an exactly collinear third term)
    if fit.ginv_dropped is None and two is not None and two.ginv_dropped is not None and small.any():
        fit.ginv_dropped = np.zeros_like(fit.ginv)
    if fit.ginv_dropped is not None:
        fit.ginv_dropped[small] = 0.0
        if two is not None and two.ginv_dropped is not None and small.any():
            fit.ginv_dropped[small, :2, :2] = two.ginv_dropped[small]
        fit.ginv_dropped[:, tiny] = 0.0
    beta = fit.beta
    if two is not None and small.any():
        beta[small] = 0.0
        beta[small, :2] = two.beta[small]
    beta[:, tiny] = 0.0
    beta[..., 1] += 1.0
    return beta, ginv


def _negative_weights(gx: np.ndarray, c0: np.ndarray, rg: _RowGroups, n: np.ndarray) -> np.ndarray:
    """(K, G): whether some sample row of the group has a negative g-weight ``1 + x_iᵀ c`` in the key's fit:
    a given row (``gx`` (K, m) holds ``x_iᵀ c``) or a row not given, ``x = (1, 0, …, 0)`` (``c0`` (K, G))."""
    K, G = c0.shape
    bad = np.zeros((K, G), dtype=bool)
    if len(rg.gid):
        bad[:, rg.present] = np.minimum.reduceat(gx, rg.first, axis=1) < -1.0
    bad |= (n > rg.rows) & (c0 < -1.0)
    return bad


def _unsupported_terms(bad: np.ndarray, X: list[_Design], rg: _RowGroups, P: int,
                       first: list[int] | None = None) -> np.ndarray:
    """(K, G, P): for the keys and groups ``bad`` (K, G), the terms from ``first[k]`` on (default 2: never the
    intercept or the model's prediction) non-zero on fewer than :data:`MIN_ROWS_PER_TERM` of the group's given
    rows."""
    out = np.zeros((*bad.shape, P), dtype=bool)
    if not bad.any() or not len(rg.present):
        return out
    for k, x in enumerate(X):
        lo = 2 if first is None else max(2, first[k])
        if not bad[k].any() or lo >= x.p:
            continue
        count = np.zeros((rg.G, x.p), dtype=np.int64)  # of the terms from lo on only (every query asks)
        if lo < x.d:  # the rows are sorted by group: each group's non-zeros are one reduceat over its slice
            count[rg.present, lo:x.d] = np.add.reduceat(x.dense[lo:, :len(rg.gid)] != 0, rg.first, axis=1).T
        for t, (pos, vals) in enumerate(x.sparse):
            if x.d + t >= lo:
                count[:, x.d + t] = np.bincount(rg.gid[pos[vals != 0]], minlength=rg.G)
        out[k, :, lo:x.p] = (count[:, lo:] < MIN_ROWS_PER_TERM) & bad[k][:, None]
    return out


def _finite_or_zero(a: np.ndarray) -> np.ndarray:
    """``a`` with its entries that are not finite set to 0 (in place)."""
    if not np.isfinite(a).all():
        a[~np.isfinite(a)] = 0.0
    return a


def _dead_terms(X: list[_Design], d: np.ndarray) -> np.ndarray:
    """(K, G, q): per key and group, the terms whose sum of squares ``d`` (K, G, q) over the group's rows is at
    most (1e-9 · the term's largest magnitude over all given rows)² (never the intercept). A term's largest
    square is at most its largest group sum of squares, so the magnitudes are read from the rows only for a key
    where that bound leaves some non-zero sum in doubt; elsewhere a term is dead where its sum is 0."""
    bound = d.max(axis=1, keepdims=True) if d.shape[1] else np.zeros_like(d)
    doubt = (d > 0) & (d <= 2e-18 * bound)  # (1e-9)² with a margin for rounding
    doubt[..., 0] = False
    dead = d == 0
    for k in np.flatnonzero(doubt.any(axis=(1, 2))):
        size = np.zeros(d.shape[2])  # (terms past the key's own are 0)
        q = min(X[k].p, d.shape[2])
        size[:q] = X[k].size()[:q]
        dead[k] = d[k] <= (1e-9 * size) ** 2
    dead[..., 0] = False
    return dead


def _one_minus_capped(h: np.ndarray) -> np.ndarray:
    """``1 − h`` with the leverage ``h`` (modified in place) capped to [0, :data:`MAX_LEVERAGE`], 0 where not
    finite."""
    if not np.isfinite(h).all():
        h[~np.isfinite(h)] = 0.0
    np.clip(h, 0.0, MAX_LEVERAGE, out=h)
    return np.subtract(1.0, h, out=h)


def _pinv_symmetric(A: np.ndarray, rcond: np.ndarray, wider: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """The pseudo-inverses of a stack of symmetric matrices (G, p, p), eigenvalues below ``rcond`` (G,) times
    the largest in size dropped (``numpy.linalg.pinv(A, rcond, hermitian=True)``, from one ``eigh``); and, from
    the same ``eigh``, the part ``Σ u uᵀ/s`` over the eigenvalues it dropped that lie above ``wider`` (scalar,
    below ``rcond``) times the largest (what the pseudo-inverse keeping those too adds), or None where there are
    none in any matrix of the stack (or ``wider`` is None)."""
    s, u = np.linalg.eigh(A)
    mag = np.abs(s)
    top = mag.max(axis=1, keepdims=True)
    keep = mag > rcond[:, None] * top
    inv = _from_eigen(s, u, keep)
    if wider is None:
        return inv, None
    more = (mag > wider * top) & ~keep
    if not more.any():
        return inv, None
    return inv, _from_eigen(s, u, more)


def _from_eigen(s: np.ndarray, u: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``U diag(1/s) Uᵀ`` over the eigenvalues ``keep`` (G, p) of each matrix, 0 for the others."""
    inv_s = np.divide(1.0, s, out=np.zeros_like(s), where=keep)
    return (u * inv_s[:, None, :]) @ u.transpose(0, 2, 1)
