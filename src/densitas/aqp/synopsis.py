"""A synopsis in memory, and the estimators that answer a query from it.

**Grid estimator (default, ``method="grid"``): a model-assisted regression estimator.** A query with predicate
box ``B`` over the column set ``S`` and aggregated value ``y`` (1 for COUNT(*), the column for SUM, its non-NULL
indicator for COUNT(col)) asks for ``T_g = Σ_rows y·1_B(x)`` per synopsis group ``g``. The answer has two parts:

1. *The model* (how small the error is). Each group's joint distribution is modelled as a tree over ``S``: the
   maximum spanning forest, by the build's dependence scores, of the stored pair grids among ``S`` (a Chow–Liu
   tree restricted to the query); columns with no stored pair between them are independent; within a fine bin
   rows are spread evenly. Message passing on the fine bins (``λ_u = φ_u·Π_children E[λ_v | cell of u]``,
   ``φ_u`` the box's share of each fine bin) gives the model's prediction for a row given any one column's fine
   bin, and from it *auxiliary* functions whose population totals the synopsis holds exactly (functions of one
   column's fine bin, of a stored pair grid's cells, of a sum grid's cells: :meth:`Synopsis._auxiliaries`).
2. *The sample* (why the interval is honest). The stratified sample's rows carry their true ``y·1_B``; the
   generalized regression estimator of :mod:`densitas.aqp.estimator` (Särndal, Swensson & Wretman 1992,
   §6.4–6.6) fits them on the auxiliaries per group and adds the sample's Horvitz–Thompson estimate of the
   residual total. It is design-consistent whatever the model gets wrong (three-way dependence, functional
   dependence, a dependence no pair grid holds), and its variance comes from the residuals' sample variance:
   a model that misses the data widens the interval instead of biasing the answer.

The variance is the larger of the residuals' and the model's variance for rows in the fine bins the box cuts
(Bernoulli placement plus the disagreement with a linear density through the neighbouring bins,
:meth:`_placement`, each cut bin's rows worth what the sample's rows of that bin add to the answer,
:meth:`_placement_moments`; :func:`interval_variance`): a box edge inside a bin splits rows the sample may not see, so
the residual variance alone can miss that part of the error when it is concentrated in few rows; where the
sample does see them, the residuals already hold it and adding the two would count it twice. A cut bin counts in
the placement term only in the groups where the sample does not see it (:meth:`Synopsis._unseen`: fewer than
``SEEN_ROWS`` sample rows in it, or fewer than ``SEEN_SIDE`` inside the box or outside the cut): where it does,
the bin's own residuals estimate its error by design, and the model's Bernoulli placement (which takes the rows
of a bin as randomly placed) made intervals too wide on regular data (UN population, 98–99% coverage). Bins cut
at an end keep it in grouped synopses (their residuals are 0 by construction). No constant is fitted to a
reported workload (``SEEN_ROWS`` was chosen on the tuning tables). Intervals are
normal; AVG by the delta method (the residual of ``SUM − AVG·COUNT``).
With the whole group as the sample the answer is exact; with no predicate the fine histograms give exact
totals; discrete columns whose values each own a fine bin are answered exactly by the model.

**KDE estimator** (``method="kde"``; documents 000 and 003). Each sample row carries a Gaussian kernel with the
column's ``densitas.kde`` bandwidth, truncated to the column's range so that no mass leaks out of it (discrete
columns keep point masses); the answer is ``(N/n)·Σ_i y_i·Π_j ∫_{B_j} K_j(x − x_ij) dx`` in closed form. It
is kept for comparison (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

from densitas.aqp.columns import ColumnInfo, slope_error, stored_dispersion, stored_placement, to_number
from densitas.aqp.connector import Connector
from densitas.aqp.estimator import FEW_GROUPS, Auxiliaries, regression_totals, scratch
from densitas.aqp.sql import Condition, Query
from densitas.aqp.store import StoredPair
from densitas.exceptions import UnsupportedQueryError

__all__ = ["MIN_SUPPORT", "GroupVariances", "Synopsis", "interval_variance", "load", "z_value"]

# an answer whose interval rests on fewer sample rows inside the box than this carries a warning
MIN_SUPPORT = 10
# a fine bin the box cuts holding at least this many of a group's sample rows adds no placement variance in that
# group: the residuals there hold its error (Synopsis._unseen). Chosen on the tuning tables (synthetic, seeds
# 902-904): with 10, the answers whose interval it narrowed had E|z| 0.88-0.98 (0.80 is right); with 30, 0.62-0.90
SEEN_ROWS = 30
# ... and at least this many of them lie on each side of the box's cut
SEEN_SIDE = 5
# at most this many fine bins of a column cut by the box get a within-bin position term (a range cuts two)
MAX_EDGE_TERMS = 4
# the whole sample's mean of a value per fine bin of a predicate column (the shape a sum grid's coarse cells
# lack) is taken over runs of consecutive bins holding at least this many sample rows
POOLED_RUN_ROWS = 32
# a query's designs for its first this many keys are written into memory kept per thread (estimator.scratch)
SCRATCH_SLOTS = 4
# the keys that sum a column's values: a SUM's raw values ("s"), an AVG's less the column's centre ("d")
SUM_KINDS = ("s", "d")


@dataclass
class _Forest:
    """The query's maximum spanning forest of stored pair grids."""

    edges: list[tuple[int, int]]
    adj: dict[int, list[int]]
    comps: list[list[int]]
    comp_of: dict[int, int]


@dataclass
class _EdgeBin:
    """A fine bin the box cuts, on the query's sample rows: the positions in the rows of the bin's rows, their
    groups, their position within the bin ``(x − lo)/width − ½``, and per group that position's total over the
    table's rows of the bin (exact from the bin's stored count and sum)."""

    b: int
    at: np.ndarray
    gid: np.ndarray
    position: np.ndarray
    position_total: np.ndarray


@dataclass
class _Ends:
    """Per fine bin of a continuous column: its smallest and largest value ``vmin``, ``vmax``, the shares of its
    rows (in the whole table) at each, ``a_lo`` and ``a_hi``, and the range ``[inner_lo, inner_hi)`` the others
    are spread over (``known``: bins with such counts); for a query's box, the share of that range inside it and
    whether each end is."""

    vmin: np.ndarray
    vmax: np.ndarray
    a_lo: np.ndarray
    a_hi: np.ndarray
    inner_lo: np.ndarray
    inner_hi: np.ndarray
    inner_width: np.ndarray
    known: np.ndarray
    inner: np.ndarray | None = None
    in_lo: np.ndarray | None = None
    in_hi: np.ndarray | None = None
    end_cut: np.ndarray | None = None  # the bins the box cuts at an end only: their rows' places are known

    @property
    def spread(self) -> np.ndarray:
        """The share of the bin's rows between its ends."""
        return np.clip(1.0 - self.a_lo - self.a_hi, 0.0, 1.0)

    @property
    def whole(self) -> np.ndarray:
        """Whether the box keeps the whole bin."""
        return (self.in_lo == 1) & (self.in_hi == 1) & (self.inner == 1)

    def share(self) -> np.ndarray:
        """The share of the bin's rows in the box."""
        return np.where(self.whole, 1.0, self.a_lo * self.in_lo + self.a_hi * self.in_hi + self.spread * self.inner)

    def value_share(self, mean: np.ndarray, offset: float) -> np.ndarray:
        """(G, B): per group and bin the box's part of the bin's mean value less ``offset`` (``mean``, (G, B), the
        bin's mean less it): the rows at the ends at their own values (their shares are the whole table's), the
        others at the rest of the group's mean; the mean itself where the box keeps the whole bin."""
        lo, hi = self.a_lo * (self.vmin - offset), self.a_hi * (self.vmax - offset)
        part = lo * self.in_lo + hi * self.in_hi + self.inner * (mean - lo - hi)
        return np.where(self.whole, mean, part)


def _accepts(v: np.ndarray, lo: float, loi: bool, hi: float, hii: bool) -> np.ndarray:
    """Whether each value of ``v`` satisfies ``lo <(=) v <(=) hi`` (False where NaN)."""
    return ((v > lo) | ((v == lo) & loi)) & ((v < hi) | ((v == hi) & hii))


@dataclass
class GroupVariances:
    """What a query's variance function gives for the groups it is asked about: each group's sampling variance
    (the residuals' or the model's, :func:`interval_variance`, plus the noise of the shift below,
    :meth:`~densitas.aqp.estimator.GroupTotals.extrapolation_noise`) and, where the fit left directions out, what
    they would move the group's total by (signed, :meth:`~densitas.aqp.estimator.GroupTotals.extrapolation_shift`),
    and the regression estimator's first-order bias (signed, :meth:`~densitas.aqp.estimator.GroupTotals.bias_shift`).

    Examples
    --------
    >>> v = GroupVariances(np.array([1.0, 2.0, 4.0]), np.array([3.0, -1.0, 0.5]))
    >>> v.per_answer(np.array([0, 0, 1]), 2).tolist()      # 1 + 2 + (3 − 1)², 4 + 0.5²
    [7.0, 4.25]
    """

    sampling: np.ndarray
    extrapolation: np.ndarray | None = None
    splits: list[SplitTerm] = dataclasses.field(default_factory=list)
    # per group, the regression estimator's first-order bias (signed; GroupTotals.bias_shift): an answer over many
    # groups adds them up, and the interval holds the answer with and without it
    bias: np.ndarray | None = None

    def per_answer(self, codes: np.ndarray, m: int) -> np.ndarray:
        """(m,): the variance of each answer that adds up the groups ``codes`` maps to it: the sampling variances
        summed, plus the square of the shifts' sum, plus each end split's (:class:`SplitTerm`).

        Examples
        --------
        >>> GroupVariances(np.array([1.0, 2.0]), np.array([3.0, 3.0])).per_answer(np.array([0, 0]), 1).tolist()
        [39.0]
        """
        v = np.bincount(codes, self.sampling, minlength=m)
        if self.extrapolation is not None:
            v = v + np.bincount(codes, self.extrapolation, minlength=m) ** 2
        if self.bias is not None:
            v = v + np.bincount(codes, self.bias, minlength=m) ** 2
        for t in self.splits:
            v = v + t.per_answer(codes, m)
        return v

    def without(self, empty: np.ndarray) -> GroupVariances:
        """These variances with the groups ``empty`` (a mask over the groups asked about) at 0.

        Examples
        --------
        >>> v = GroupVariances(np.array([1.0, 2.0]), np.array([3.0, -1.0])).without(np.array([False, True]))
        >>> v.sampling.tolist(), v.extrapolation.tolist()
        ([1.0, 0.0], [3.0, 0.0])
        """
        shift = None if self.extrapolation is None else np.where(empty, 0.0, self.extrapolation)
        bias = None if self.bias is None else np.where(empty, 0.0, self.bias)
        return GroupVariances(np.where(empty, 0.0, self.sampling), shift, [t.without(empty) for t in self.splits],
                              bias)


@dataclass
class SplitTerm:
    """The variance an answer takes from how the table's ``c`` rows at one end of a fine bin the box cuts there
    are split among the synopsis' groups: the model gives each group its share ``p_g`` of the bin's rows
    (:meth:`Synopsis._shares`), and a group whose share is off moves rows worth ``a_g`` each (its combination of
    the keys' per-row values) in or out of the box. Were the rows split at random by those shares (multinomial),
    an answer adding up the groups ``O`` would be off by ``Σ_O a_g (c_g − c·p_g)``, of variance ``c·(Σ_O p_g a_g²
    − (Σ_O p_g a_g)²)``: 0 for a count over every group, as the groups' rows there add up to ``c``. ``weight`` is
    ``c`` times the end's measured dispersion (:func:`~densitas.aqp.build.end_dispersion`, for the query's
    grouping): the split's variance in the table against the random one's.

    The variance splits into the answer's share as a whole, ``c·P_O(1 − P_O)·ā²`` (``P_O = Σ_O p_g``, ``ā`` the
    mean of ``a`` over ``O`` by share), which takes the dispersion measured for the query's grouping (``weight``),
    and the spread of ``a`` among the answer's groups, ``c·(Σ_O p_g a_g² − P_O ā²)``, which takes the dispersion
    among all the synopsis' groups (``within``): a SUM over every group of a column whose mean differs from group
    to group moves with which groups hold the end's rows, though their count is exact.

    Examples
    --------
    >>> t = SplitTerm(10.0, np.array([0.5, 0.5]), np.array([1.0, 1.0]), 10.0)   # two groups of half the bin, a = 1
    >>> t.per_answer(np.array([0, 1]), 2).tolist(), t.per_answer(np.array([0, 0]), 1).tolist()
    ([2.5, 2.5], [0.0])
    >>> SplitTerm(10.0, np.array([0.5, 0.5]), np.array([1.0, 3.0]), 10.0).per_answer(np.array([0, 0]), 1).tolist()
    [10.0]
    """

    weight: float
    p: np.ndarray  # (groups asked about,) each group's share of the bin's rows
    a: np.ndarray  # (groups asked about,) what a row of the group moved across the cut adds
    within: float = 0.0

    def per_answer(self, codes: np.ndarray, m: int) -> np.ndarray:
        """(m,): the variance of each answer adding up the groups ``codes`` maps to it.

        Examples
        --------
        >>> SplitTerm(4.0, np.array([0.25, 0.25]), np.array([2.0, 2.0])).per_answer(np.array([0, 1]), 2).tolist()
        [3.0, 3.0]
        """
        s0 = np.bincount(codes, self.p, minlength=m)
        s1 = np.bincount(codes, self.p * self.a, minlength=m)
        s2 = np.bincount(codes, self.p * self.a * self.a, minlength=m)
        whole = np.where(s0 > 0, s1 ** 2 / np.where(s0 > 0, s0, 1.0), 0.0)  # P_O ā²
        return self.weight * np.maximum(whole - s1 ** 2, 0.0) + self.within * np.maximum(s2 - whole, 0.0)

    def without(self, empty: np.ndarray) -> SplitTerm:
        """This term with the groups ``empty`` held exactly (their rows at the end known: no error of their own;
        their shares stay, as the others' rows at the end are what theirs leave).

        Examples
        --------
        >>> t = SplitTerm(1.0, np.array([0.5, 0.5]), np.array([1.0, 1.0])).without(np.array([True, False]))
        >>> t.a.tolist()
        [0.0, 1.0]
        """
        return SplitTerm(self.weight, self.p, np.where(empty, 0.0, self.a), self.within)


@dataclass
class _EndSplit:
    """One end of a fine bin the box cuts there (:meth:`Synopsis._end_splits`): its rows times their measured
    dispersion among the groups, each group's share of the bin's rows (G,) and what a row of it moved across the
    cut adds to each key (G, K)."""

    weight: float
    share: np.ndarray
    per_row: np.ndarray
    within: float = 0.0  # the end's rows times their dispersion among all the groups

    def term(self, gids: np.ndarray, W: np.ndarray) -> SplitTerm:
        """The :class:`SplitTerm` of the groups ``gids`` for the combination ``W`` (len(gids), K) of the keys."""
        return SplitTerm(self.weight, self.share[gids], np.einsum("gk,gk->g", W, self.per_row[gids]), self.within)


def _bins_kept(vmin: np.ndarray, vmax: np.ndarray, ivals: list) -> tuple[np.ndarray, np.ndarray]:
    """Per fine bin whose rows' values lie in ``[vmin, vmax]`` (its occupied range): whether the intervals ``ivals``
    keep every one of them (``inside``: one interval holds both ends) and whether they reach any (``reached``).

    Examples
    --------
    >>> inside, reached = _bins_kept(np.array([0.0, 2.0, 4.0]), np.array([1.0, 3.0, 5.0]),
    ...                              [(-math.inf, False, 2.5, False)])            # x < 2.5
    >>> inside.tolist(), reached.tolist()
    ([True, False, False], [True, True, False])
    """
    inside = np.zeros(len(vmin), dtype=bool)
    reached = np.zeros(len(vmin), dtype=bool)
    for lo, loi, hi, hii in ivals:
        inside |= _accepts(vmin, lo, loi, hi, hii) & _accepts(vmax, lo, loi, hi, hii)
        reached |= ((lo < vmax) | ((lo == vmax) & loi)) & ((hi > vmin) | ((hi == vmin) & hii))
    return inside, reached


class _Rows:
    """The sample rows a query reads, in sample order (so by group): every row where a target or an auxiliary of
    the query can be non-zero, and maybe more (:meth:`Synopsis._rows`); the estimator treats the others in
    closed form (:mod:`densitas.aqp.estimator`). A column's values and fine bins on these rows are gathered
    when first asked for."""

    def __init__(self, idx: np.ndarray, gid: np.ndarray, vals_by_col: np.ndarray, bins_by_col: np.ndarray,
                 cell_index: Callable[[int], np.ndarray], centre_of: Callable[[tuple], float]) -> None:
        self.idx = idx  # (m,) positions in the sample
        self.gid = gid  # (m,) group
        self._vals_by_col, self._bins_by_col = vals_by_col, bins_by_col  # (J, n) the whole sample's
        self._cell_index = cell_index  # the whole sample's flat (group, fine bin) index (Synopsis._cell_index)
        self._vals: dict[int, np.ndarray] = {}
        self._bins: dict[int, np.ndarray] = {}
        self._flat: dict[int, np.ndarray] = {}  # per column, the rows' flat (group, fine bin) index
        self._key_values: dict[tuple, np.ndarray] = {}
        self._centre_of = centre_of  # what a key subtracts from each value it sums (Synopsis._centre_of)
        self.edges: dict[int, list[_EdgeBin]] = {}  # per predicate column, its cut bins (Synopsis._edge_bins)
        self.ends: dict[int, _Ends | None] = {}  # per predicate column, its bins' ends in the box (Synopsis._shares)
        self.end_rows: dict[int, tuple | None] = {}  # per predicate column, Synopsis._end_rows
        self.sides: dict[int, tuple] = {}  # per predicate column, Synopsis._side_counts
        self.seen: dict[int, tuple] = {}  # per predicate column, Synopsis._seen_counts
        self._boxed: np.ndarray | None = None  # per group, its rows in the box (boxed_per_group)
        self.inside = np.ones(len(idx), dtype=bool)  # whether the row is in the query's box (set by the caller)
        self.match: dict[int, np.ndarray] = {}  # per predicate column, whether the row meets its condition

    def boxed_per_group(self, G: int) -> np.ndarray:
        """(G,): per group, how many of these rows lie in the query's box (``inside``, set by the caller before);
        computed once."""
        if self._boxed is None:
            self._boxed = np.bincount(self.gid[self.inside], minlength=G)
        return self._boxed

    def position(self, sample_rows: np.ndarray) -> np.ndarray:
        """The positions among these rows (``idx`` is sorted) of those of the sample's rows ``sample_rows`` that
        are read, in increasing order."""
        wanted = np.sort(sample_rows)
        if not len(self.idx):
            return np.zeros(0, dtype=np.int64)
        at = self.idx.searchsorted(wanted)
        found = self.idx.take(at, mode="clip") == wanted
        return at if found.all() else at[found]

    def vals(self, j: int) -> np.ndarray:
        """(m,): column ``j``'s values (NaN where NULL)."""
        got = self._vals.get(j)
        if got is None:
            got = self._vals[j] = self._vals_by_col[j].take(self.idx)
        return got

    def bins(self, j: int) -> np.ndarray:
        """(m,): column ``j``'s fine bin (0 = NULL)."""
        got = self._bins.get(j)
        if got is None:
            got = self._bins[j] = self._bins_by_col[j].take(self.idx)
        return got

    def at(self, table: np.ndarray, j: int, cells: np.ndarray | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
        """(m,): ``table[g, c]`` (``table`` (G, C)) at each row's group ``g`` and cell ``c``: its fine bin of column
        ``j``, or ``cells[bin]`` (a map of the bins to coarser cells); written into ``out`` when given. A coarse
        table is first spread over the fine bins (G × bins, small), so every table of a column is read through the
        column's one index of the rows' (group, fine bin)."""
        if cells is not None:
            table = table.take(cells, axis=1)
        return table.take(self.cells(j), out=out, mode="clip")  # in range by construction; "raise" buffers ``out``

    def cells(self, j: int) -> np.ndarray:
        """(m,): each row's flat (group, fine bin of column ``j``) index into a (G, B_j + 1) table."""
        flat = self._flat.get(j)
        if flat is None:
            flat = self._flat[j] = self._cell_index(j).take(self.idx)
        return flat

    def key_values(self, key: tuple[str, int | None]) -> np.ndarray:
        """(m,): what ``key`` sums on each row before the box (:meth:`Synopsis._sample_values`)."""
        got = self._key_values.get(key)
        if got is None:
            kind, j = key
            if kind == "n":
                got = np.ones(len(self.idx))
            elif kind in SUM_KINDS:
                got = _centred(self.vals(j), self._centre_of(key))
            else:
                got = (~np.isnan(self.vals(j))).astype(np.float64)
            self._key_values[key] = got
        return got


@dataclass
class Pair(StoredPair):
    """A stored pair grid as the model uses it (:class:`~densitas.aqp.store.StoredPair`, ``res`` the resolution
    its maps reach) with what the model derives from it."""

    starts: tuple[np.ndarray, np.ndarray]  # per dimension: first fine bin of each cell (maps are monotone)
    rowsum: tuple[np.ndarray, np.ndarray]  # per dimension: (G, res + 1) rows per cell
    flat: tuple[np.ndarray, np.ndarray]  # per dimension and stored cell: its index gid·(res + 1) + c in a (G, res + 1)


def _runs(rows: np.ndarray, least: int) -> np.ndarray:
    """Per bin (bin 0 the NULL bin, a run of its own) its run: consecutive bins 1.. gathered until a run holds at
    least ``least`` rows; a short last run joins the one before it.

    Examples
    --------
    >>> _runs(np.array([4, 5, 62, 3, 40, 1, 30]), 32).tolist()  # 67, 43 rows; the last 31 join the second
    [0, 1, 1, 2, 2, 2, 2]
    """
    run = np.zeros(len(rows), dtype=np.int64)
    current, held = 1, 0
    for i in range(1, len(rows)):
        if held >= least:
            current, held = current + 1, 0
        run[i] = current
        held += int(rows[i])
    if current > 1 and held < least:  # the last run is short: into the one before
        run[run == current] = current - 1
    return run


def _product_sums(at: np.ndarray, y: np.ndarray, size: int, weight: np.ndarray | None = None) -> np.ndarray:
    """(size, K, K): per slot, the (``weight``-ed) sum of ``y yᵀ`` over the rows ``at`` puts there.

    Examples
    --------
    >>> _product_sums(np.array([0, 0, 1]), np.array([[2.0, 1.0], [1.0, 0.0], [3.0, 1.0]]), 2)[0].tolist()
    [[5.0, 2.0], [2.0, 1.0]]
    """
    K = y.shape[1]
    out = np.zeros((size, K, K))
    for k in range(K):
        for k2 in range(k, K):
            w = y[:, k] * y[:, k2] if weight is None else weight * y[:, k] * y[:, k2]
            out[:, k, k2] = out[:, k2, k] = np.bincount(at, w, minlength=size)
    return out


def _weighted_moments(at: np.ndarray, weight: np.ndarray, e: np.ndarray, size: int) -> np.ndarray:
    """(size, K, K): per slot, the ``weight``-ed mean of ``e eᵀ`` over the rows ``at`` puts there (0 where none).

    Examples
    --------
    >>> _weighted_moments(np.array([0, 0, 1]), np.array([1.0, 3.0, 1.0]), np.array([[2.0], [0.0], [1.0]]), 3)[:, 0, 0]
    array([1., 1., 0.])
    """
    den = np.bincount(at, weight, minlength=size)
    sums = _product_sums(at, e, size, weight)
    return np.where(den[:, None, None] > 0, sums / np.where(den > 0, den, 1.0)[:, None, None], 0.0)


def _starts(m: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.diff(m, prepend=-1))


class Synopsis:
    """Loaded synopsis of one table (see :mod:`densitas.aqp.build`)."""

    def __init__(self, meta: dict, infos: list[ColumnInfo], groups: pd.DataFrame, marg: dict, sums: dict,
                 pairs: list[Pair], scores: dict, sample_gid: np.ndarray, sample_vals: np.ndarray,
                 outliers: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        self.meta = meta
        self.table = meta["table_name"]
        self.infos = infos
        self.index = {info.name: j for j, info in enumerate(infos)}
        self.group_by: list[str] = json.loads(meta["group_by"])
        self.groups = groups  # gid order: group columns + n
        self.N = groups["n"].to_numpy(dtype=np.float64)
        G = len(self.N)
        self.fine = {j: marg[j][0] for j in marg}  # (G, B_j + 1) exact counts per fine bin, bin 0 NULL
        self.mean = {}
        for j, (w, sm) in marg.items():
            with np.errstate(invalid="ignore", divide="ignore"):
                m = np.where(w > 0, sm / np.where(w > 0, w, 1), 0.0)
            m[:, 0] = 0.0
            self.mean[j] = m
        # an AVG's key ("d", j) sums each value less its column's mean in the table (the centre): a fit's errors
        # scale with the values it fits, and a column far from 0 against its spread (a year, an id) put an AVG
        # over one year 3.5 years off (births, with the raw sums); estimate() adds the centre back. A SUM keeps
        # the raw values ("s", j): where most values are 0 they cost nothing raw, and a centred SUM adds the
        # count's error times the centre
        self.centre = {j: _centre(infos[j], self.fine[j], self.mean[j]) for j in marg}
        self.cmean = {j: np.where(np.arange(m.shape[1]) > 0, m - self.centre[j], 0.0) for j, m in self.mean.items()}
        self.sums = {u: (cmap, _with_deviations(tot, self.centre)) for u, (cmap, tot) in sums.items()}
        # j -> (map, {key: (G, R + 1) totals}) with key ("n", None), ("s", k), ("d", k), ("nn", k)
        self.pairs = {p.cols: p for p in pairs}
        self.scores = scores
        self.bandwidths = json.loads(meta.get("bandwidths") or "[]")
        # the step each column's sample values are rounded to (build.sample_decimals, build.sample_value; 0:
        # exact values): a stored value r stands for a row's value within a step of it, in the same fine bin
        stored = json.loads(meta.get("options") or "{}")
        decimals = stored.get("sample_decimals") or [None] * len(infos)
        lossless = stored.get("sample_lossless") or [False] * len(infos)  # values on the step's grid: exact
        self.step = np.array([0.0 if d is None or kept else 10.0 ** -d
                              for d, kept in zip(decimals, lossless, strict=True)])
        # the sample, sorted by group; values NaN where NULL
        order = np.argsort(sample_gid, kind="stable")
        self.s_gid = sample_gid[order].astype(np.int64)
        self.s_vals = sample_vals[order]
        self.n = np.bincount(self.s_gid, minlength=G).astype(np.float64)
        self.s_start = np.concatenate([[0], np.cumsum(self.n)]).astype(np.int64)
        self._moment_cache: dict = {}
        self._label_cache: dict = {}
        self._s_bins: np.ndarray | None = None
        self._clamp_rounded_values()
        self._vals_by_col = np.ascontiguousarray(self.s_vals.T)  # (J, n): one column's values contiguous
        self._bins_by_col: np.ndarray | None = None
        self._bin_order: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._spreads: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._held: dict[int, np.ndarray] = {}  # per column, which (group, fine bin) holds rows (_whole_or_none)
        self._ends_cache: dict[int, _Ends | None] = {}
        self._cell_bounds: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._cell_indexes: dict[int, np.ndarray] = {}
        self._bin_sum_cache: dict[int, np.ndarray] = {}
        self._dispersion_cache: dict[int, float] = {}
        self._bin_mean_cache: dict[tuple, np.ndarray] = {}
        self._sum_start_cache: dict[int, np.ndarray] = {}
        self._cell_count_cache: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._sum_ratio_cache: dict[tuple, np.ndarray] = {}
        self._unseen_cache: dict[tuple, tuple[np.ndarray, ...]] = {}
        self._missing_cache: dict[int, np.ndarray] = {}  # per column, _missing_bins
        self.read_all_rows = False  # the reference computation: every sample row enters every query
        # groups the sample does not hold whole: only there do a cut bin's sampled rows enter by their own place
        # (_end_rows), as a group sampled whole is answered exactly by its rows, and the shares of the ends' rows
        # the model gives a group (the build counts them in the whole table) would move that off
        self._partial = self.n < self.N
        # the rows set aside whole at the build (a value far out in a heavy tail): the histograms, grids and
        # sample describe the others, and every query adds these rows' exact share (_outlier_totals)
        o_gid, o_vals = outliers if outliers is not None else (np.zeros(0, np.int64), np.zeros((0, len(infos))))
        self.o_gid, self.o_vals = np.asarray(o_gid, dtype=np.int64), np.asarray(o_vals, dtype=np.float64)
        # each group's rows, those set aside included: no COUNT of the group is more (Synopsis.estimate's bounds)
        self._group_rows = self.N + np.bincount(self.o_gid, minlength=G)

    # ---- query resolution -------------------------------------------------------------------------------
    def size_bytes(self) -> int:
        return int(self.meta["size_bytes"])

    def _box(self, q: Query) -> tuple[dict[int, list[tuple[float, bool, float, bool]]], np.ndarray]:
        """Per synopsis column, the condition's interval(s) as (lo, lo_inclusive, hi, hi_inclusive); and the
        mask of groups the categorical conditions keep."""
        box: dict[int, list] = {}
        gmask = np.ones(len(self.N), dtype=bool)
        for c in q.conditions:
            if c.column in self.index:
                j = self.index[c.column]
                ivals = self._intervals(self.infos[j], c)
                box[j] = ivals if j not in box else _intersect(box[j], ivals)
            elif c.column in self.group_by:
                vals = c.value if c.op == "in" else (c.value,)
                if c.op not in ("=", "in"):
                    raise UnsupportedQueryError(f"{c.op!r} on the categorical column {c.column!r} ({c.sql!r}); "
                                                "categorical columns take = and IN")
                col = self.groups[c.column]
                keep = np.zeros(len(self.N), dtype=bool)
                for v in vals:
                    keep |= _matches(col, v)
                gmask &= keep
            else:
                raise UnsupportedQueryError(self._missing(c.column, "WHERE"))
        return box, gmask

    def _avg_bounds(self, j: int, box: dict[int, list[tuple[float, bool, float, bool]]]) -> tuple[float, float]:
        """Where an AVG of column ``j`` surely lies: within the column's range in the table and, where the query
        bounds the column, within the union of its intervals (an average of values in a box is in the box)."""
        info = self.infos[j]
        lo, hi = info.lo, info.hi
        if j in box and not box[j]:  # conditions no value meets (y > 5 AND y < 3): no bound, an empty answer
            return math.nan, math.nan
        if j in box:
            lo = max(lo, min(iv[0] for iv in box[j]))
            hi = min(hi, max(iv[2] for iv in box[j]))
        return lo, hi

    def _centre_of(self, key: tuple[str, int | None]) -> float:
        """What ``key`` subtracts from each value it sums: the column's centre for an AVG's key ``("d", j)``."""
        return self.centre[key[1]] if key[0] == "d" else 0.0

    def _count_key(self, column: str | None) -> tuple[str, int | None]:
        """Which stored total counts the rows an aggregate of ``column`` sees (non-NULL rows)."""
        if column is None:
            return ("n", None)
        j = self.index[column]
        return ("nn", j) if self.infos[j].nullable else ("n", None)

    def _missing(self, column: str, where: str) -> str:
        return (f"column {column!r} in {where} is not in the synopsis of {self.table!r} (synopsis columns: "
                f"{[i.name for i in self.infos]}; group_by: {self.group_by}); rebuild with it or use "
                "fallback='exact'")

    def _intervals(self, info: ColumnInfo, c: Condition) -> list[tuple[float, bool, float, bool]]:
        where = f"WHERE {c.sql!r}"
        if c.op == "in":
            pts = [to_number(info, v, where) for v in c.value]
            return [(p, True, p, True) for p in sorted(set(pts))]
        v = to_number(info, c.value, where)
        return [{"<": (-math.inf, False, v, False), "<=": (-math.inf, False, v, True),
                 ">": (v, False, math.inf, False), ">=": (v, True, math.inf, False),
                 "=": (v, True, v, True)}[c.op]]

    def _spread(self, j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per fine bin of column ``j``: the extent its rows are spread over (:meth:`ColumnInfo.spread`) and
        whether it holds one value only (:func:`_point_bins`); computed once."""
        got = self._spreads.get(j)
        if got is None:
            lower, upper = self.infos[j].spread()
            got = self._spreads[j] = (lower, upper, _point_bins(self.infos[j], lower, upper))
        return got

    def _keeps_every_row(self, j: int, ivals: list) -> bool:
        """Whether the condition on ``j`` keeps every row of the table: the column has no NULLs and one of the
        condition's intervals holds its whole range, bounds' strictness included (``visits >= 1`` on a column
        whose least value is 1; not ``x > 0`` where x's least value is 0). Then it is no predicate for the model
        and adds no terms to the fit. Decided on the bounds, not the model's shares, which spread a bin's rows
        over its range and count a strict bound at the least value as keeping them all."""
        info = self.infos[j]
        if self.fine[j][:, 0].any():
            return False
        ends = np.array([info.lo, info.hi])
        return any(_accepts(ends, *iv).all() for iv in ivals)

    def _whole_or_none(self, j: int, ivals: list) -> tuple[np.ndarray, np.ndarray] | None:
        """Per group, whether the condition on ``j`` keeps every one of the rows the grids and the sample describe
        (``all``) or none of them (``none``); None where the bins' occupied ranges are not stored.

        Decided per fine bin on the values its rows hold (``occupied_min``, ``occupied_max``): a bin whose least
        and greatest values both satisfy one interval has every row in, one no interval reaches has every row out.
        A column a group determines (``age_group_start`` under a group ``age_group``) or a bound beyond the rows
        kept in the grids (``population < 358913033`` where only rows set aside whole lie above) cuts no group's
        rows in part: it is then no predicate for the model (:meth:`_predicate_columns`). The rows set aside
        whole are not decided here: they meet the whole box row by row (:meth:`_outlier_totals`)."""
        info = self.infos[j]
        vmin, vmax = info.occupied_min, info.occupied_max
        if len(vmin) != info.bins or len(vmax) != info.bins:
            return None
        known = np.isfinite(vmin) & np.isfinite(vmax)
        inside, reached = _bins_kept(vmin, vmax, ivals)
        held = self._held.get(j)
        if held is None:  # (G, B + 1): bin 0 holds the NULLs, which no condition keeps
            held = self._held[j] = self.fine[j] > 0
        every = ~held[:, 0] & ~(held[:, 1:] & ~(known & inside)).any(axis=1)
        none = ~(held[:, 1:] & ~(known & ~reached)).any(axis=1)
        return every, none

    def _doubtful(self, cols: tuple[int, ...], box: dict, reads: bool, empty: np.ndarray) -> np.ndarray | None:
        """(n,): per sample row, its weight ``N_g / n_g`` where the rounding of its stored values leaves its place
        in the box in doubt, else 0; None where no row is (:func:`~densitas.aqp.build.sample_decimals`). A stored
        value ``r`` of a predicate column (the row's within a step of it) within a step of one of its condition's
        bounds may lie on either side of it, where the answer reads the sample (``reads``; not in the groups
        ``empty``); the rows' weights and weighted values bound what that can move an answer by."""
        if not reads or not (self.step[list(cols)] > 0).any():
            return None
        doubt = np.zeros(len(self.s_gid), dtype=bool)
        for u in cols:
            h = self.step[u]
            if h <= 0:
                continue
            v = self._vals_by_col[u]
            near = np.zeros(len(v), dtype=bool)
            for lo, _, hi, _ in box[u]:
                for bound in (lo, hi):
                    if math.isfinite(bound):
                        near |= np.abs(bound - v) <= h * (1 + 1e-9)
            doubt |= near & self._in_part_kept_bins(u, box[u])
        doubt &= ~empty[self.s_gid]
        if not doubt.any():
            return None
        return np.where(doubt, (self.N / np.maximum(self.n, 1))[self.s_gid], 0.0)

    def _in_part_kept_bins(self, u: int, ivals: list) -> np.ndarray | bool:
        """(n,): per sample row, whether the intervals ``ivals`` on ``u`` keep some but not all of the rows of its
        fine bin, by the values the bin's rows hold (``occupied_min``, ``occupied_max``). Elsewhere every row of the
        bin lies on one side, and so does its stored value, kept within that range (:meth:`_clamp_rounded_values`):
        a bound on a value the bin starts at (``weight < 72.0``, 72.0 the least value of its bin) leaves no row in
        doubt. True for every row where the occupied ranges are not stored."""
        info = self.infos[u]
        if len(info.occupied_min) != info.bins or len(info.occupied_max) != info.bins:
            return True
        inside, reached = _bins_kept(info.occupied_min, info.occupied_max, ivals)
        part = np.concatenate([[False], reached & ~inside])  # bin 0: NULL, which no condition keeps
        return part[self._bins_by_column()[u]]

    def _doubt_total(self, w: np.ndarray | None, j: int | None = None) -> np.ndarray:
        """(G,): per group, the rows in doubt's weights ``w`` (:meth:`_doubtful`), times ``|value of j|`` when
        given (NULL: 0)."""
        if w is None:
            return np.zeros(len(self.N))
        if j is not None:
            w = w * np.nan_to_num(np.abs(self._vals_by_col[j]))
        return np.bincount(self.s_gid, w, minlength=len(self.N))

    def _predicate_columns(self, box: dict) -> tuple[tuple[int, ...], np.ndarray]:
        """The columns whose conditions cut some group's rows in part, in column order, and per group whether a
        condition on another column keeps none of its rows (:meth:`_whole_or_none`): the model and the fit see
        only the former, and the latter groups' grid totals are 0."""
        cols, empty = [], np.zeros(len(self.N), dtype=bool)
        for u in sorted(box):
            if self._keeps_every_row(u, box[u]):
                continue
            states = self._whole_or_none(u, box[u])
            if states is not None and (states[0] | states[1]).all():
                empty |= states[1]
                continue
            cols.append(u)
        return tuple(cols), empty

    def _fractions(self, j: int, ivals: list) -> np.ndarray:
        """(B_j + 1,): the share of each fine bin's rows that satisfy the condition (bin 0, NULL, never)."""
        return self._shares(j, ivals)[0]

    def _shares(self, j: int, ivals: list) -> tuple[np.ndarray, _Ends | None]:
        """(B_j + 1,): the share of each fine bin's rows that satisfy the condition (bin 0, NULL, never), and where
        the bins' ends are known (:meth:`_ends`), the parts it is made of (:class:`_Ends`).

        A bin's rows at its smallest and largest value are point masses there, in the box or not as the
        condition takes those values; the others are spread evenly between them. A bound at a bin's end (``x <
        max(x)``, or a quantile edge on a column of few distinct values) so keeps or drops exactly the rows there,
        where a spread over the whole range counted a point as holding no rows (nafld2's ``value < 13682``, the
        largest value, kept its two rows with an interval ±0.0004 rows wide)."""
        info = self.infos[j]
        e = info.edges
        if info.discrete:
            f = np.zeros(len(e) + 1)
            for lo, loi, hi, hii in ivals:
                f[1:] += _accepts(e, lo, loi, hi, hii)
            return np.minimum(f, 1.0), None
        e, upper, point = self._spread(j)  # point: one value only, in the box or not, like a discrete bin
        width = np.where(upper > e, upper - e, 1.0)
        ends = self._ends(j)
        f = np.zeros(len(e) + 1)
        parts = None
        if ends is not None:
            inner = np.zeros(len(e))
            at_lo, at_hi = np.zeros(len(e)), np.zeros(len(e))
        for lo, loi, hi, hii in ivals:
            L, U = _half_open(info, lo, loi, hi, hii)
            share = np.clip(np.minimum(upper, U) - np.maximum(e, L), 0.0, None) / width
            at = _accepts(e, lo, loi, hi, hii)
            f[1:] += np.where(point, at, share)
            if ends is not None:
                takes_lo, takes_hi = _accepts(ends.vmin, lo, loi, hi, hii), _accepts(ends.vmax, lo, loi, hi, hii)
                # no room between the ends (values v and v + step): what lies between is in where both ends are
                inner += np.where(ends.inner_hi > ends.inner_lo,
                                  np.clip(np.minimum(ends.inner_hi, U) - np.maximum(ends.inner_lo, L), 0.0, None)
                                  / ends.inner_width, takes_lo & takes_hi)
                at_lo += takes_lo
                at_hi += takes_hi
        if ends is not None:
            parts = dataclasses.replace(ends, inner=np.minimum(inner, 1.0), in_lo=np.minimum(at_lo, 1.0),
                                        in_hi=np.minimum(at_hi, 1.0))
            share = parts.share()
            f[1:] = np.where(ends.known, share, f[1:])
            parts.end_cut = ends.known & ((parts.inner == 0) | (parts.inner == 1)) & (share > 0) & (share < 1)
        return np.minimum(f, 1.0), parts

    def _ends(self, j: int) -> _Ends | None:
        """Per fine bin of column ``j`` (continuous, not discrete, more than one value): the shares of the table's
        bin rows at its smallest and largest value, and the range between them; None where the build stored no
        counts."""
        if j in self._ends_cache:
            return self._ends_cache[j]
        info = self.infos[j]
        got = None
        if len(info.count_at_min) == info.bins and len(info.occupied_min) == info.bins and not info.discrete:
            n_b = self.fine[j][:, 1:].sum(axis=0)
            nmin, nmax = np.nan_to_num(info.count_at_min), np.nan_to_num(info.count_at_max)
            vmin, vmax = info.occupied_min, info.occupied_max
            known = (n_b > 0) & (nmin > 0) & (nmax > 0) & np.isfinite(vmin) & np.isfinite(vmax) & (vmax > vmin) \
                & ~self._spread(j)[2]  # a bin of one value is cut exactly already
            with np.errstate(invalid="ignore", divide="ignore"):
                a_lo = np.where(known, nmin / np.where(n_b > 0, n_b, 1), 0.0)
                a_hi = np.where(known, nmax / np.where(n_b > 0, n_b, 1), 0.0)
            inner_lo = np.where(known, vmin + info.step, 0.0)
            inner_hi = np.where(known, vmax, 0.0)
            width = inner_hi - inner_lo
            got = _Ends(np.where(known, vmin, np.nan), np.where(known, vmax, np.nan), a_lo, a_hi, inner_lo,
                        inner_hi, np.where(width > 0, width, 1.0), known)
            if not known.any():
                got = None
        self._ends_cache[j] = got
        return got

    def _unseen(self, u: int, rows: _Rows | None) -> np.ndarray:
        """(G, B_u + 1): 1 where the placement term of a fine bin of ``u`` counts in a group, 0 where the sample
        sees the bin well enough for the residuals to hold its error: at least :data:`SEEN_ROWS` of the group's
        sample rows lie in it, at least :data:`SEEN_SIDE` of them inside the query's whole box and as many beyond
        ``u``'s cut (``rows.match``; the rule of thumb for a binomial's normal approximation, ``np`` and ``n(1 − p)`` at
        least 5: a bound that keeps one row in 100 of a group's bin, or drops one in 400, leaves no sampled row on
        that side, a residual variance of 0 and an answer that row off inside a zero-width interval). Bins cut at
        an end only keep the term in groups not sampled whole when the synopsis has several groups: their rows'
        own places make every residual there 0 while the bin's total takes the table's share of the rows at each
        end (:meth:`_end_rows`), an error no residual shows."""
        G, B1 = self.fine[u].shape
        if rows is None:
            return np.ones((G, B1))
        seen = _seen(*self._seen_counts(u, rows))
        parts = rows.ends.get(u)
        if G > 1 and parts is not None:
            seen[:, 1:] &= ~(parts.end_cut & self._partial[:, None])
        return (~seen).astype(np.float64)

    def _unseen_by_sample(self, u: int, rows: _Rows | None) -> np.ndarray:
        """(B_u + 1,): 1 where the whole query sample (every group's rows together) sees a fine bin of ``u`` too
        little for the residuals to correct the model's placement there, by :meth:`_unseen`'s rule: a shape the
        groups share (:meth:`_shape_error`) is corrected by all their sample rows in the bin together."""
        if rows is None:
            return np.ones(self.fine[u].shape[1])
        return (~_seen(*(c.sum(axis=0) for c in self._seen_counts(u, rows)))).astype(np.float64)

    def _seen_counts(self, u: int, rows: _Rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(G, B_u + 1) three times: per group and fine bin of ``u``, the query's sample rows there, those of them
        inside the whole box, and those beyond ``u``'s cut (:meth:`_unseen`, :meth:`_unseen_by_sample`); computed
        once per query and column."""
        got = rows.seen.get(u)
        if got is None:
            G, B1 = self.fine[u].shape
            m, kept = (c.reshape(G, B1) for c in self._side_counts(u, rows))
            m_in = np.bincount(rows.cells(u), rows.match[u] & rows.inside, minlength=G * B1).reshape(G, B1)
            got = rows.seen[u] = (m, m_in, m - kept)
        return got

    def _placed_inside(self, S: list[int], phis: dict, rows: _Rows) -> np.ndarray:
        """(m,): each query sample row's part in the box, as the fit's targets take it: 1 or 0 as the row is in the
        box or not, except in a fine bin the box cuts between its ends where all the group's sample rows in the bin
        lie on one side of the cut and the model's share of the other side is one so few rows would miss
        (:meth:`_one_sided`). There the row stands for the bin's rows at the box's share of the bin, the answer
        places them as the model does, and the placement term states the error. With the row's own side, a cut
        that keeps all but a few of a bin's rows (``x < 0.997`` on a bin [0.876, 1)) found none of its ~18
        sampled rows beyond it, and the correction took away the ~9 rows the model placed there: every group's
        COUNT at its whole size, 84% of the 95% intervals covering, the errors one-sided (RESULTS, twenty-fourth
        session)."""
        inside = rows.inside.astype(np.float64)
        if not self._partial.any():
            return inside
        blind = {}
        for u in S:
            ph = np.asarray(phis[u], dtype=np.float64).reshape(-1)
            cut = (ph > 0) & (ph < 1)
            cut[0] = False
            parts = rows.ends.get(u)
            if parts is not None:  # cut at an end only: the row's own value says where it is (_end_rows)
                cut[1:] &= ~parts.end_cut
            if not cut.any():
                continue
            b = rows.bins(u)
            at = cut.take(b) & self._partial.take(rows.gid)
            if at.any():
                at &= self._one_sided(u, rows, ph)
            if at.any():
                blind[u] = (at, ph.take(b))
        if not blind:
            return inside
        for u in S:
            factor = rows.match[u].astype(np.float64)
            if u in blind:
                at, share = blind[u]
                factor[at] = share[at]
            inside = factor if u == S[0] else inside * factor
        return inside

    def _side_counts(self, u: int, rows: _Rows) -> tuple[np.ndarray, np.ndarray]:
        """(G·(B_u + 1),) twice, flat by (group, fine bin of ``u``): the query's sample rows there, and those of them
        ``u``'s condition keeps; computed once per query and column (:meth:`_unseen`, :meth:`_one_sided`)."""
        got = rows.sides.get(u)
        if got is None:
            size, cell = self.fine[u].size, rows.cells(u)
            got = rows.sides[u] = (np.bincount(cell, minlength=size), np.bincount(cell, rows.match[u], minlength=size))
        return got

    def _one_sided(self, u: int, rows: _Rows, ph: np.ndarray) -> np.ndarray:
        """(m,): whether the row's group's sample rows in the row's fine bin of ``u`` all lie on one side of
        ``u``'s condition, and the model's share ``ph`` of the bin's rows on the other side is one the sample does
        not refute: having seen none there in ``m`` rows, the 95% upper bound on that share is ``3/m`` (the "rule
        of three"), and the model's share is within it. A share above it is refuted: the group's rows in the bin
        lie on the seen side, not spread over the bin as the model has them (births' states, each at its own
        level within a table-wide bin of ``births``), and the sample's side stands."""
        m, kept = (c.take(rows.cells(u)) for c in self._side_counts(u, rows))  # per row, its group's bin's
        share = ph.take(rows.bins(u))
        unseen_share = np.where(kept == 0, share, 1.0 - share)  # the model's share of the side no sample row is on
        return ((kept == 0) | (kept == m)) & (m * unseen_share <= 3.0)

    def _slope_var(self, j: int, ivals: list, unseen: np.ndarray | None = None) -> np.ndarray:
        """(G, B + 1): squared disagreement, in each fine bin the box cuts, between the uniform spread within
        a bin and a linear density through the neighbouring bins' densities: the systematic part of the
        within-bin placement error, which the Bernoulli term misses where the density is steep. ``unseen`` (G, B + 1):
        each group's weight of each bin (:meth:`_unseen`; all 1 when not given)."""
        info = self.infos[j]
        G = len(self.N)
        e, up, _ = self._spread(j)
        B = len(e)
        out = np.zeros((G, B + 1))
        if info.discrete:
            return out
        w = self.fine[j]
        ends = self._ends(j)
        one_group = ends is not None and G == 1  # with more, the ends' rows are shared among the groups
        for lo, loi, hi, hii in ivals:
            L, U = _half_open(info, lo, loi, hi, hii)
            for x in (L, U):
                if not math.isfinite(x):
                    continue
                i = int(np.searchsorted(e, x, side="right"))  # fine bin (1..B) holding x
                if i < 1 or i > B or x <= e[i - 1] or x >= up[i - 1]:
                    continue
                if one_group and ends.known[i - 1] and not ends.inner_lo[i - 1] < x < ends.inner_hi[i - 1]:
                    continue  # at the bin's end rows: they are where the build counted them
                part = slope_error(w, e, up, np.array([i]), np.array([x]))[:, 0] ** 2
                out[:, i] += part if unseen is None else part * unseen[:, i]
        return out

    def _row_match(self, j: int, ivals: list, v: np.ndarray) -> np.ndarray:
        ok = np.zeros(v.shape, dtype=bool)
        for iv in ivals:
            ok |= _accepts(v, *iv)  # NaN (NULL) compares false
        return ok

    def _outlier_totals(self, box: dict, keys: list) -> np.ndarray:
        """(G, len(keys)): the exact totals of the rows set aside whole (``o_vals``) that lie in ``box``, per group
        and key: their count (``("n", None)``), non-NULL count (``("nn", j)``), sum (``("s", j)``) and sum less
        the column's centre (``("d", j)``)."""
        inside = np.ones(len(self.o_gid), dtype=bool)
        for j, ivals in box.items():
            inside &= self._row_match(j, ivals, self.o_vals[:, j])
        gid, vals = self.o_gid[inside], self.o_vals[inside]
        out = np.zeros((len(self.N), len(keys)))
        for k, (kind, j) in enumerate(keys):
            if j is None:
                w: np.ndarray | float = 1.0
            else:
                v = vals[:, j]
                known = ~np.isnan(v)
                w = {"nn": known, "s": np.where(known, v, 0.0), "d": np.where(known, v - self.centre[j], 0.0)}[kind]
            out[:, k] = np.bincount(gid, np.broadcast_to(w, gid.shape).astype(np.float64), minlength=len(self.N))
        return out

    # ---- estimation -----------------------------------------------------------------------------------------
    def estimate(self, q: Query, method: str = "grid") -> tuple[dict, list[dict]]:
        """The output groups' label columns (name -> array; empty without GROUP BY), and per aggregate the
        estimate and variance of each output group."""
        for g in q.group_by:
            if g not in self.group_by:
                raise UnsupportedQueryError(self._missing(g, "GROUP BY"))
        box, gmask = self._box(q)
        cols, empty = self._predicate_columns(box)
        needs = []
        for a in q.aggregates:
            if a.column is None:
                needs.append(("n", None))
                continue
            if a.column not in self.index:
                raise UnsupportedQueryError(self._missing(a.column, f"{a.func.upper()}({a.column})"))
            j = self.index[a.column]
            info = self.infos[j]
            if a.func in ("sum", "avg") and not info.numeric:
                raise UnsupportedQueryError(f"{a.func.upper()} of the {info.kind} column {a.column!r}")
            nn = self._count_key(a.column)
            needs += [nn] if a.func == "count" else [("s" if a.func == "sum" else "d", j), nn]
        keys = list(dict.fromkeys([("n", None), *needs]))  # row counts always: empty groups are dropped
        # reads: whether the answer reads the sample's values (not held exactly by the grids)
        # the group columns the answers are split by: their GROUP BY, and those a condition keeps values of
        grouping = sorted(set(q.group_by) | {c.column for c in q.conditions if c.column in self.group_by})
        est, var_fn, support, reads = (self._grid(cols, box, keys, grouping) if method == "grid"
                                       else self._kde(cols, box, keys))
        if empty.any():  # a condition keeps none of these groups' rows: their grid totals are 0, surely
            est, var_fn, support = _held_exactly(empty, 0.0, est, var_fn, support)
        if len(self.o_gid):
            est = est + self._outlier_totals(box, keys)  # exact: no variance

        # output groups
        gids = np.flatnonzero(gmask)
        if q.group_by:
            ck = (tuple(q.group_by), gmask.tobytes())
            if ck not in self._label_cache:
                if len(self._label_cache) > 256:  # distinct group filters are few in practice; stay bounded
                    self._label_cache.clear()
                labels = self.groups.loc[gids, list(q.group_by)].reset_index(drop=True)
                codes = labels.groupby(list(q.group_by), dropna=False, sort=True).ngroup().to_numpy()
                first = labels.drop_duplicates().assign(_c=codes[~labels.duplicated().to_numpy()])
                first = first.sort_values("_c").drop(columns="_c").reset_index(drop=True)
                self._label_cache[ck] = (codes, {c: first[c].array for c in first.columns})
            codes, out = self._label_cache[ck]
            m = len(next(iter(out.values())))
        else:
            codes = np.zeros(len(gids), dtype=np.int64)
            out, m = {}, 1
        sup = support[gids]
        sampled = np.isfinite(sup)
        thin = (np.bincount(codes, sampled, minlength=m) > 0) & \
            (np.bincount(codes, np.where(sampled, sup, 0.0), minlength=m) < MIN_SUPPORT)
        doubt = self._doubtful(cols, box, reads, empty)
        moved = self._doubt_total(doubt)  # per group, the weight of the rows the doubt may add or drop
        reading = np.full(len(self.N), float(reads)) * ~empty  # groups whose answer reads the sample's values
        rows_of = np.bincount(codes, self._group_rows[gids], minlength=m)  # no answer counts more rows
        results = []
        for a in q.aggregates:
            if a.func == "count":
                k = keys.index(self._count_key(a.column))
                val = np.bincount(codes, est[gids, k], minlength=m)
                v = var_fn(gids, [k], [1.0]).per_answer(codes, m)
                results.append({"alias": a.alias, "func": "count", "value": val, "var": v, "count": val, "thin": thin,
                                "slack": np.bincount(codes, moved[gids], minlength=m),
                                "bounds": (np.zeros(m), rows_of)})
                continue
            j = self.index[a.column]
            kn = keys.index(self._count_key(a.column))
            cnt = np.bincount(codes, est[gids, kn], minlength=m)
            # the rounding of the sample's values (build.sample_decimals), added to the interval's half-width: less
            # than a step a value the answer reads from the sample, and every row whose place in the box the
            # rounding leaves in doubt (_doubtful) counted at its weight and value
            slack = np.bincount(codes, np.abs(est[gids, kn]) * reading[gids], minlength=m) * self.step[j]
            slack = slack + np.bincount(codes, self._doubt_total(doubt, j)[gids], minlength=m)
            if a.func == "sum":
                ks = keys.index(("s", j))
                tot = np.bincount(codes, est[gids, ks], minlength=m)
                v = var_fn(gids, [ks], [1.0]).per_answer(codes, m)
                results.append({"alias": a.alias, "func": "sum", "value": tot, "var": v, "count": cnt, "thin": thin,
                                "slack": slack, "bounds": _sum_bounds(*self._avg_bounds(j, box), rows_of)})
                continue
            ks, c = keys.index(("d", j)), self.centre[j]  # the key sums v − c over the rows the count key counts
            dev = np.bincount(codes, est[gids, ks], minlength=m)
            with np.errstate(divide="ignore", invalid="ignore"):
                mean_dev = dev / cnt
                # delta method: the residual of SUM − AVG·COUNT (centred alike), with the output group's AVG
                v = var_fn(gids, [ks, kn], [1.0, -np.nan_to_num(mean_dev)[codes]]).per_answer(codes, m) / cnt ** 2
            with np.errstate(divide="ignore", invalid="ignore"):
                slack = slack + np.abs(np.nan_to_num(c + mean_dev)) * np.bincount(codes, moved[gids], minlength=m)
                slack = np.where(slack > 0, slack / np.abs(cnt), 0.0)
            results.append({"alias": a.alias, "func": "avg", "value": c + mean_dev, "var": v, "count": cnt,
                            "thin": thin, "bounds": tuple(np.full(m, b) for b in self._avg_bounds(j, box)),
                            "slack": slack,
                            "magnitude": abs(c)})  # the AVG is c + a mean: float rounding of c's size
        if q.group_by:  # SQL has no row for a group without matching rows: drop groups surely empty
            rows = np.bincount(codes, est[gids, 0], minlength=m)
            rvar = var_fn(gids, [0], [1.0]).per_answer(codes, m)
            keep = (rows >= 0.5) | (rvar > 0)
            if not keep.all():
                out = {c: v[keep] for c, v in out.items()}
                for r in results:
                    for k in ("value", "var", "count", "thin", "slack"):
                        if k in r:
                            r[k] = np.asarray(r[k])[keep]
                    r["bounds"] = tuple(b[keep] for b in r["bounds"])
        return out, results

    # ---- the model: a tree of pair grids over fine histograms ---------------------------------------------
    def _tree(self, nodes: list[int]) -> list[tuple[int, int]]:
        """Maximum spanning forest (by dependence score) of the stored pair grids among ``nodes``."""
        cand = sorted((p for p in self.pairs if p[0] in nodes and p[1] in nodes), key=lambda p: -self.pairs[p].score)
        parent = {u: u for u in nodes}

        def find(u):
            while parent[u] != u:
                parent[u] = parent[parent[u]]
                u = parent[u]
            return u

        out = []
        for a, b in cand:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
                out.append((a, b))
        return out

    def _cell_mean(self, j: int, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """(G, cells): the count-weighted mean of the per-fine-bin ``x`` ((B_j + 1,) or (G, B_j + 1)) of column
        ``j`` within each cell."""
        num = np.add.reduceat(self.fine[j] * x, starts, axis=1)
        filled, den = self._cell_counts(j, starts)
        num /= den
        num *= filled  # 0 in empty cells
        return num

    def _cell_counts(self, j: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per group and cell (cells: runs of fine bins of column ``j`` from ``starts``, a map's cached starts):
        whether the cell holds rows (1.0 or 0.0) and its row count (1 where none); computed once per map."""
        key = (j, id(starts))
        got = self._cell_count_cache.get(key)
        if got is None or got[0] is not starts:  # (the starts kept with it: their id names them while cached)
            den = np.add.reduceat(self.fine[j], starts, axis=1)
            got = self._cell_count_cache[key] = (starts, (den > 0).astype(np.float64), np.where(den > 0, den, 1))
        return got[1], got[2]

    def _message(self, pair: Pair, v: int, lam_v: np.ndarray) -> np.ndarray:
        """E[lambda_v(x_v) | x_u's cell] for each fine bin of u, through the grid of ``pair``, (G, B_u + 1)."""
        dv = pair.cols.index(v)
        du = 1 - dv
        lbar = self._cell_mean(v, lam_v, pair.starts[dv])
        G = len(self.N)
        R = pair.res[du] + 1
        num = np.bincount(pair.flat[du], pair.n * lbar.take(pair.flat[dv]), minlength=G * R).reshape(G, R)
        den = pair.rowsum[du]
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
        return mu[:, pair.maps[du]]

    def _lam(self, u: int, parent: int | None, adj: dict, phis: dict, memo: dict | None = None) -> np.ndarray:
        """(G, B_u + 1): ``u``'s factor times the messages from its neighbours but ``parent``. ``memo`` keeps each
        (node, parent) answer for the same ``phis``: a message is the same whichever root asks for it."""
        if memo is not None and (u, parent) in memo:
            return memo[(u, parent)]
        lam = self._incoming(u, parent, adj, phis, memo)
        lam *= phis[u]
        if memo is not None:
            memo[(u, parent)] = lam
        return lam

    def _incoming(self, u: int, parent: int | None, adj: dict, phis: dict, memo: dict | None = None) -> np.ndarray:
        """(G, B_u + 1): the product of the messages to ``u``'s fine bins from its neighbours but ``parent`` (the
        model's expectation of their subtrees' factors given ``u``'s bin), a new array; ``u``'s own factor is
        left out. Their subtrees' answers come from ``memo`` where it holds them (:meth:`_lam`)."""
        lam = np.ones(self.fine[u].shape)
        for v in adj[u]:
            if v != parent:
                pair = self.pairs[(min(u, v), max(u, v))]
                lam *= self._message(pair, v, self._lam(v, u, adj, phis, memo))
        return lam

    def _expect(self, comp: list[int], adj: dict, phis: dict, memo: dict | None = None) -> np.ndarray:
        """(G,): E[prod of the component's factors] per group."""
        root = comp[0]
        lam = self._lam(root, None, adj, phis, memo)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.N > 0, (self.fine[root] * lam).sum(axis=1) / np.maximum(self.N, 1), 0.0)

    def _grid(self, cols, box, keys, grouping: list[str] | None = None):
        """Per group and key the regression estimate (G, len(keys)) and a function giving per-group variances of
        linear combinations of the keys (module docstrings of this module and :mod:`densitas.aqp.estimator`);
        ``grouping``: the group columns the answers are split by (:meth:`_end_splits`)."""
        S = list(cols)
        shares = {u: self._shares(u, box[u]) for u in S}
        phis = {u: share for u, (share, _) in shares.items()}
        ends = {u: parts for u, (_, parts) in shares.items()}
        whole = self._whole_cell_groups(S, box, phis, keys)
        if not S:
            exact = np.stack([self._unboxed_total(k) for k in keys], axis=1)
        elif whole is not None and whole[0].all():
            exact = whole[1]
        else:
            exact = self._exact_totals(S, keys, phis, ends)
        if exact is not None:  # no predicate (the fine histograms), or predicate columns whose grids hold
            return exact, lambda gids, ks, ws: GroupVariances(np.zeros(len(gids))), self._support(None), False  # exact
        tree = self._forest(S)
        memo: dict = {}  # messages under the box's own factors (the row-count key's)
        E = [self._expect(comp, tree.adj, phis, memo) for comp in tree.comps]
        count = self.N * np.prod(E, axis=0) if E else self.N.copy()
        keyphis = [self._key_factors(k, S, phis, ends) for k in keys]
        rows = self._rows(S, box, phis)
        rows.ends = ends
        y = scratch("targets", (len(keys), len(rows.idx)))  # each key's y·1_B, key by key
        inside = self._placed_inside(S, phis, rows)
        for t, k in enumerate(keys):
            np.multiply(rows.key_values(k), inside, out=y[t])
        base = _least_cut_first(S, self.fine, phis)  # the fit's base prediction from the column the box cuts least
        aux = [self._auxiliaries(k, base, phis, kp, tree, rows, _shared_messages(memo, tree, phis, kp), memo, slot)
               for slot, (k, kp) in enumerate(zip(keys, keyphis, strict=True))]
        totals = regression_totals(y.T, aux, rows.gid, self.N, self.n)
        # the placement variance: per cut bin, relative (_placement) times count² times E[y yᵀ] among the bin's rows
        # (_placement_moments), a quadratic form in the keys' weights, expanded as the residuals' are (N²(1 − n/N)/n:
        # a group sampled whole is exact); taken with the residuals' in one product, combined by interval_variance
        scale = (count / np.maximum(self.N, 1)) ** 2 * totals.expansion * self.n
        dispersion = self._split_dispersion(S, ends, grouping)  # the bins cut at an end whose split is measured
        split = {u: self._split_applied(u, d[0], ends[u], len(S) == 1) for u, d in dispersion.items()}
        parts = self._placement(S, phis, box, ends, rows, split, grouping)
        place = self._placement_moments(parts, keys, split) * scale[:, None, None]
        quadratic = np.stack([totals.residual_scatter, place], axis=1)  # (G, 2, K, K)
        splits = self._end_splits(phis, ends, keys, count, dispersion, split)
        unseen = self._unseen_values(S, phis, keys, count)  # (G, K, K) or None: rows no sample row stands for
        K = len(keys)
        reproduced = None  # (G, K, K): a count with none of the variation the model expects (_reproduced_count)
        if ("n", None) in keys:
            t = keys.index(("n", None))
            share = [rows.at(np.broadcast_to(phis[u], self.fine[u].shape), u) for u in S]
            uncut = np.logical_and.reduce([(f == 0.0) | (f == 1.0) for f in share])  # in no bin the box cuts
            reproduced = _reproduced_count(t, K, aux[t].terms[0], y[t], rows.gid, self.n, uncut)
            if reproduced is not None:
                reproduced *= totals.expansion[:, None, None]
        for floor in (self._unseen_nulls(S, phis, keys, count, rows),  # NULLs no sample row in the box shows
                      self._unsampled_box(keys, count, rows),  # a box none of a group's sample rows lies in
                      self._unseen_bins(S, phis, keys, rows, tree, E, memo)):  # bins a cell's share places
            if floor is not None:  # (G, K, K) per unit of the groups' expansion, as the residuals'
                floor *= totals.expansion[:, None, None]
                unseen = floor if unseen is None else unseen + floor

        def var_fn(gids, ks, ws):
            W = np.zeros((len(gids), K))
            for k, wk in zip(ks, ws, strict=True):
                W[:, k] += wk
            scatter, placement = np.einsum("gk,gjkl,gl->jg", W, quadratic[gids], W)
            residual = totals.residual_variance(gids, scatter, ks)
            if reproduced is not None:
                residual = residual + np.maximum(np.einsum("gk,gkl,gl->g", W, reproduced[gids], W), 0.0)
            sampling = interval_variance(residual, np.maximum(placement, 0.0))
            if unseen is not None:
                sampling = sampling + np.maximum(np.einsum("gk,gkl,gl->g", W, unseen[gids], W), 0.0)
            return GroupVariances(sampling + totals.extrapolation_noise(gids, W), totals.extrapolation_shift(gids, W),
                                  [end.term(gids, W) for end in splits], totals.bias_shift(gids, W))

        if whole is not None:  # these groups' answers the grids hold exactly
            return (*_held_exactly(whole[0], whole[1], totals.value, var_fn, self._support(rows)), True)
        return totals.value, var_fn, self._support(rows), True

    # ---- the steps of the grid estimator ----------------------------------------------------------------------
    def _whole_cell_groups(self, S: list[int], box: dict, phis: dict, keys: list
                           ) -> tuple[np.ndarray, np.ndarray] | None:
        """Under one predicate column ``u``: the groups whose rows the box keeps or drops by whole cells of
        ``u``'s sum grid (each fine bin the group has rows in kept or dropped whole, and each of its cells kept
        or dropped whole), and their keys' totals, (G,) and (G, len(keys)); None where there are none. A bin is
        kept or dropped whole where its own value is (a discrete column) or where the values its rows hold
        (``occupied_min``, ``occupied_max``) all meet the condition or none does (:func:`_bins_kept`), not where
        the model's share says 0 or 1: a full-precision DOUBLE's bin narrower than a billionth of its values is
        one value to the model (:meth:`_spread`), and a bound inside it had 8 groups of epoch seconds answered
        "exactly" 3% off (found in review). Such a
        group's counts are its fine bins', its sums of ``u`` their exact sums, and every other column's sums and
        non-NULL counts its cells' totals (the cells matter only where a key is another column's): the answer is
        exact, whatever its sample rows show. Every group so under a discrete column (each value its own fine bin)
        whose sum grid is at full resolution: the query's answer is the grids' (fertility's ``SUM(age) WHERE work
        >= 40`` from the fit was ±900 around it). A group of few routes (flights' carriers under a distance range:
        US's rows at one distance each from two airports) was answered from the fit, whose terms the sample could
        not tell apart (no NULL ``arr_delay`` among its 77 sampled rows of 1,090), 8 rows off with a zero-width
        interval."""
        if len(S) != 1:
            return None  # (no predicate: the fine histograms; two or more: their joint rows are not held)
        u = S[0]
        tot = self.sums[u][1]
        if any(kind != "n" and j != u and (kind, j) not in tot for kind, j in keys):
            return None
        kept, decided = self._bins_decided(u, box[u], phis[u])
        if kept is None:
            return None
        w = self.fine[u]
        exact_of = ((w == 0) | decided).all(axis=1)
        if any(kind != "n" and j != u for kind, j in keys):  # another column's totals: from whole cells
            q = self._cell_mean(u, kept, self._sum_starts(u))  # each cell's share in the box, by the group's rows
            filled, _ = self._cell_counts(u, self._sum_starts(u))
            exact_of &= ((filled == 0) | (q == 0.0) | (q == 1.0)).all(axis=1)  # integer counts: exactly 0 or 1
        if not exact_of.any():
            return None
        factors = {**phis, u: kept}
        return exact_of, np.stack([(w * self._key_factors(k, S, factors)[u]).sum(axis=1) for k in keys], axis=1)

    def _bins_decided(self, u: int, ivals: list, ph: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(B_u + 1,) or (G, B_u + 1) twice: per fine bin of ``u``, 1.0 where the condition ``ivals`` keeps every one
        of its rows (else 0.0), and whether it keeps all or none of them (the NULL bin 0: none). A discrete
        column's bin is its value, which the model's share ``ph`` keeps or not; another's from the values its rows
        hold (None, None where those ranges are not stored)."""
        info = self.infos[u]
        if info.discrete:
            kept = np.asarray(ph, dtype=np.float64)
            return kept, (kept == 0.0) | (kept == 1.0)
        vmin, vmax = info.occupied_min, info.occupied_max
        if len(vmin) != info.bins or len(vmax) != info.bins:
            return None, None
        known = np.isfinite(vmin) & np.isfinite(vmax)
        inside, reached = _bins_kept(vmin, vmax, ivals)
        kept = np.r_[0.0, np.where(known & inside, 1.0, 0.0)]
        return kept, np.r_[True, known & (inside | ~reached)]

    def _exact_totals(self, S: list[int], keys: list, phis: dict, ends: dict) -> np.ndarray | None:
        """(G, len(keys)): the keys' totals where two predicate columns' pair grid holds them exactly
        (:meth:`_exact_pair`), else None (one column: :meth:`_whole_cell_groups`). The model's prediction is then
        the answer; the fit would add the sample's noise to it, or miss it where its terms are nearly collinear
        among a group's rows."""
        pair = self._exact_pair(S, keys)
        if pair is None:
            return None
        return np.stack([self._pair_total(pair, self._key_factors(k, S, phis, ends)) for k in keys], axis=1)

    def _exact_pair(self, S: list[int], keys: list) -> Pair | None:
        """The stored pair grid that holds the query's answer exactly, if one does: two predicate columns, both
        discrete (each value its own fine bin, which the box keeps or drops whole), their grid at full resolution
        (a cell per fine bin, so its counts are the table's per pair of values), and every key a row count or a
        value of one of the two (a fine bin's mean is then its value). Where a group's sample would otherwise
        decide, the grid's cells answer: fertility's ``SUM(work) WHERE work < 52 AND age >= 25`` was 0.08% off
        with an interval of ±0.1% (5 standard errors of bias over 24 samples, the fit's collinearity floor
        keeping it from the exact term). None where the model is not exact."""
        if len(S) != 2 or not all(self.infos[u].discrete for u in S):
            return None
        pair = self.pairs.get((min(S), max(S)))
        if pair is None or any(len(st) != len(m) for st, m in zip(pair.starts, pair.maps, strict=True)):
            return None
        if any(kind != "n" and j not in S for kind, j in keys):
            return None
        return pair

    def _pair_total(self, pair: Pair, factors: dict[int, np.ndarray]) -> np.ndarray:
        """(G,): per group, the sum over the pair grid's cells of their rows times the product of the two
        columns' per-fine-bin ``factors`` (a key's box shares with its value attached: :meth:`_key_factors`)."""
        a, b = pair.cols
        qa = self._cell_mean(a, factors[a], pair.starts[0])
        qb = self._cell_mean(b, factors[b], pair.starts[1])
        return np.bincount(pair.gid, pair.n * qa.take(pair.flat[0]) * qb.take(pair.flat[1]), minlength=len(self.N))

    def _forest(self, S: list[int]) -> _Forest:
        """The query's tree of pair grids (:meth:`_tree`) as adjacency and connected components."""
        edges = self._tree(S)
        adj: dict[int, list[int]] = {u: [] for u in S}
        for a, b in edges:
            adj[a].append(b)
            adj[b].append(a)
        comps, seen = [], set()
        for u in S:
            if u in seen:
                continue
            stack, comp = [u], []
            while stack:
                x = stack.pop()
                if x in seen:
                    continue
                seen.add(x)
                comp.append(x)
                stack += adj[x]
            comps.append(comp)
        return _Forest(edges, adj, comps, {u: ci for ci, comp in enumerate(comps) for u in comp})

    def _unboxed_total(self, key: tuple[str, int | None]) -> np.ndarray:
        kind, j = key
        if kind == "n":
            return self.N.copy()
        if kind in SUM_KINDS:
            return (self.fine[j] * self._value_factor(key)).sum(axis=1)
        return self.fine[j][:, 1:].sum(axis=1)

    def _value_factor(self, key: tuple[str, int | None]) -> np.ndarray:
        """Per fine bin of the key's column: the mean of the aggregated value (``"s"``), less its centre (``"d"``),
        or the non-NULL share."""
        kind, j = key
        if kind in SUM_KINDS:
            return self.mean[j] if kind == "s" else self.cmean[j]
        return (np.arange(self.fine[j].shape[1]) > 0).astype(np.float64)

    def _key_factors(self, key, S, phis, ends: dict | None = None) -> dict[int, np.ndarray]:
        """The per-fine-bin factors of each predicate column for ``key``: the box shares, with the aggregated
        value attached to its own column when it is a predicate column (the rows at a bin's ends at their own
        values where the box takes one end and not the other: :meth:`_Ends.value_share`), else to the predicate
        column it depends on most, through that column's sum grid."""
        kind, j = key
        out = dict(phis)
        if kind == "n":
            return out
        if j in phis:
            out[j] = phis[j] * self._value_factor(key)
            parts = (ends or {}).get(j)
            if kind in SUM_KINDS and parts is not None:
                offset = 0.0 if kind == "s" else self.centre[j]
                mean = self._value_factor(key)[:, 1:]
                out[j][:, 1:] = np.where(parts.known, parts.value_share(mean, offset), out[j][:, 1:])
            return out
        u = self._value_column(j, S)
        out[u] = phis[u] * self._sum_ratio(u, key)
        return out

    def _value_column(self, j: int, S: list[int]) -> int:
        """The predicate column of ``S`` whose sum grid carries the values of column ``j`` (not itself a predicate
        column): the one it depends on most."""
        return max(S, key=lambda x: self.scores.get((min(x, j), max(x, j)), 0.0))

    def _sum_ratio(self, u: int, key: tuple[str, int]) -> np.ndarray:
        """(G, B_u + 1): per fine bin of ``u``, the model's mean of the key's value (SUM) or its non-NULL share:
        the group's own mean over the bin's cell of ``u``'s sum grid (exact, from the grid), and for a SUM plus
        how the bin's mean departs from its cell's in the whole sample (:meth:`_pooled_shape`, the same for every
        group: with many groups a sum grid has few cells, and the shape within them is what the groups share).
        The departures are centred on each group's own rows of the cell, so the group's cell totals stay exact;
        0 in empty cells. A non-NULL share keeps its cell's (a shape added to it could leave [0, 1]). Computed
        once per column and key."""
        got = self._sum_ratio_cache.get((u, key))
        if got is None:
            cmap, tot = self.sums[u]
            n_c = tot[("n", None)]
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.where(n_c > 0, tot[key] / np.where(n_c > 0, n_c, 1), 0.0)
            ratio = ratio[:, cmap]
            if key[0] not in SUM_KINDS:
                self._sum_ratio_cache[(u, key)] = ratio
                return ratio
            shape = self._pooled_shape(u, key, ratio)
            level = self._cell_mean(u, shape, self._sum_starts(u))  # (G, cells): weighted by each group's rows
            filled = (n_c > 0)[:, cmap]
            got = self._sum_ratio_cache[(u, key)] = ratio + np.where(filled, shape - level[:, cmap], 0.0)
        return got

    def _pooled_shape(self, u: int, key: tuple[str, int], cell_means: np.ndarray) -> np.ndarray:
        """(B_u + 1,): how a SUM key's value departs from its group's sum-grid cell mean (``cell_means``, (G,
        B_u + 1) spread over the fine bins), averaged per fine bin of ``u`` over the whole sample (each group's
        rows weighted by N/n), in runs of consecutive fine bins holding at least ``POOLED_RUN_ROWS`` sample rows
        (:func:`_runs`; the NULL bin on its own). Departures, not values: the groups' levels differ, the shape is
        shared."""
        j = key[1]
        b = self._sample_bins()[:, u]
        y = _centred(self.s_vals[:, j], self._centre_of(key)) - cell_means[self.s_gid, b]
        w = (self.N / np.maximum(self.n, 1)).take(self.s_gid)
        run = _runs(np.bincount(b, minlength=self.fine[u].shape[1]), POOLED_RUN_ROWS)
        num = np.bincount(run.take(b), w * y, minlength=run[-1] + 1)
        den = np.bincount(run.take(b), w, minlength=run[-1] + 1)
        return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0).take(run)

    def _unseen_values(self, S: list[int], phis: dict, keys: list, count: np.ndarray) -> np.ndarray | None:
        """(G, K, K) or None: the variance of the keys' totals from the values of rows that no sample row of their
        group stands for. A key that sums another column's values (or counts them) takes each fine bin's mean from
        its group's cell of a predicate column's sum grid and the whole sample's shape within the cells
        (:meth:`_sum_ratio`); the fit corrects that mean from the group's sample rows in the bin, and its residual
        variance holds the error left, but a bin where the group has rows and the sample none of them (two of a
        state's 7,300 days with under 32 births, years 1970-77) has neither correction nor variance: an answer
        whose box cuts that bin's cell moved those rows' values by the model's mean, off by 0.0014 years inside
        ±0.000005.

        Such a bin's rows add ``N_gb² · E[e eᵀ]`` (``e`` a row's keys' values less the model's means for its
        group and bin; ``N_gb²``, not ``N_gb``: the few rows of a group the sample missed in one bin are alike,
        the glitch days of a state falling in the same years) weighted by ``(φ_gb − φ̄_gc)²``, the bin's share of
        the box less its cell's mean share (the cell's total is exact, so only how the box divides a cell moves
        its bins' errors into the answer), times the group's keep fraction on the other predicate columns
        squared (one average per group: off where the other predicates keep the bin's rows unevenly; keys
        carried by different columns' sum grids take no covariance). ``E[e eᵀ]`` is the whole sample's over its
        rows in the bin (each weighted by ``N/n``; in the bin's run of :data:`POOLED_RUN_ROWS` rows where fewer
        than :data:`SEEN_SIDE` lie in it), or the group's own over its sample rows where that is larger (trace):
        the unseen rows are taken to be like the other groups' rows of the bin, or like the group's own
        elsewhere. A data-estimated model-error term for rows no design variance covers; rows unlike both still
        fall outside (births' KS: six days, all in 1970, 8.5 years from the model's mean, z 3.2). The keys of a
        row count or of the predicate columns' own values take their bins' exact counts and sums, and add nothing."""
        G, K = len(self.N), len(keys)
        out = np.zeros((G, K, K))
        by_column: dict[int, list[int]] = {}
        for t, (kind, j) in enumerate(keys):
            if kind != "n" and j is not None and j not in phis:
                by_column.setdefault(self._value_column(j, S), []).append(t)
        if not by_column:
            return None
        for u, ts in by_column.items():
            ph, w = phis[u], self.fine[u]
            mean_share = self._cell_mean(u, ph, self._sum_starts(u))[:, self.sums[u][0]]  # each bin's cell's
            _, other = self._kept_rows(u, phis, count)
            missing, of_bin, of_group, larger = self._unseen_moments(u, tuple(keys[t] for t in ts))
            weight = (ph - mean_share) ** 2 * w ** 2 * missing * (other ** 2)[:, None]  # (G, B_u + 1)
            if not weight.any():
                continue
            block = np.einsum("g,gkl->gkl", (weight * larger).sum(axis=1), of_group) \
                + np.einsum("gb,bkl->gkl", weight * ~larger, of_bin)
            out[np.ix_(np.arange(G), ts, ts)] += block
        return out if out.any() else None

    def _kept_rows(self, u: int, phis: dict, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(G, B_u + 1), the rows per fine bin of ``u`` that ``u``'s conditions keep, and (G,), the share of the
        group's rows they keep that the other predicates keep too (``count``, the model's rows in the box, over
        those kept by ``u``; 0 where ``u`` keeps none): one average per group."""
        kept = self.fine[u] * phis[u]
        inside = kept.sum(axis=1)
        return kept, np.where(inside > 0, count / np.where(inside > 0, inside, 1.0), 0.0)

    def _unseen_nulls(self, S: list[int], phis: dict, keys: list, count: np.ndarray, rows: _Rows
                      ) -> np.ndarray | None:
        """(G, K, K) or None: per unit of a group's expansion ``N²(1 − n/N)/n``, the variance of the keys' totals
        from the NULLs of a column that is not a predicate, in the groups whose sample holds none of them in the
        box.

        ``COUNT(y)`` sums a row's non-NULL indicator, which the model takes from each sum grid cell's exact
        non-NULL share (:meth:`_sum_ratio`); the fit corrects it from the group's sample rows. Where a group's
        NULLs are rare (31 of 2,271 rows of a box), its sample often holds none of them in the box: every sampled
        row is non-NULL, the fit takes the share to be 1 (its residuals vanish) and the interval is zero-width
        around an answer short of every NULL in the box. The residuals' variance is the design's estimate of
        ``S²``, the rows' own variance, and here it is known better than the sample shows: a row of cell ``c``
        is NULL with the cell's exact share ``p_gc``, so the indicator's ``S²`` over the box's rows is
        ``Σ_c N_in,gc · p_gc(1 − p_gc) / N_g`` (``N_in,gc`` the model's rows of the cell in the box). In such a
        group this ``S²`` is added along the direction a NULL moves the keys (1 for the non-NULL count, the
        cell's mean value for the column's sums, which a NULL row does not add): the variance the residuals
        would show had the sample drawn its expected share of NULLs. An AVG, whose sum and count a NULL moves
        together, gains little. A group whose sample holds some of the box's NULLs keeps its residuals'
        variance alone."""
        G, K = len(self.N), len(keys)
        by_column: dict[int, list[int]] = {}
        for t, (kind, j) in enumerate(keys):
            if kind != "n" and j is not None and j not in phis and self.infos[j].nullable:
                by_column.setdefault(j, []).append(t)
        out = np.zeros((G, K, K))
        for j, ts in by_column.items():
            u = self._value_column(j, S)
            _, tot = self.sums[u]
            if ("nn", j) not in tot:
                continue
            n_c, nn_c = tot[("n", None)], tot[("nn", j)]
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(n_c > 0, (n_c - nn_c) / np.where(n_c > 0, n_c, 1), 0.0)  # (G, C): the NULL share
                sums = tot.get(("s", j), np.zeros_like(p))  # (a column counted, never summed, moves only the count)
                mean = np.where(nn_c > 0, sums / np.where(nn_c > 0, nn_c, 1), 0.0)  # a sum key's move
            kept, other = self._kept_rows(u, phis, count)
            in_box = np.add.reduceat(kept, self._sum_starts(u), axis=1) * other[:, None]  # (G, C)
            seen = np.bincount(rows.gid[rows.inside & np.isnan(rows.vals(j))], minlength=G)
            weight = in_box * p * (1 - p) * ((seen == 0) / np.maximum(self.N, 1))[:, None]  # (G, C)
            if not weight.any():
                continue
            d = np.stack([np.ones_like(p) if kind == "nn" else mean - self._centre_of((kind, j))
                          for kind, _ in (keys[t] for t in ts)], axis=2)  # (G, C, k): a NULL's move per key
            out[np.ix_(np.arange(G), ts, ts)] += np.einsum("gc,gck,gcl->gkl", weight, d, d)
        return out if out.any() else None

    def _unsampled_box(self, keys: list, count: np.ndarray, rows: _Rows) -> np.ndarray | None:
        """(G, K, K) or None: per unit of a group's expansion ``N²(1 − n/N)/n``, the variance of the keys' totals
        in the groups whose box the model gives rows and none of whose sample rows lies in it.

        There no residual shows the box's rows: the answer is the model's and the other rows' fit, stated with
        the variance of neither the box's rows nor the model's count of them: births'
        ``AVG(month) … births < 222 GROUP BY state`` gave TX 6.44 ± 0.03 against 2.0 (three glitch rows match;
        the model, spreading TX's lowest births bin by date independently, put 23.5 rows there). Had the sample
        drawn a row of the box, the residuals would have shown its rows' variance; the design's ``S²`` of the
        keys over the group's rows, ``Σ_box y yᵀ / N``, is taken as ``(count/N)·E[y yᵀ]``, ``count`` the model's
        rows in the box but no more than ``3N/n`` (a box holding none of ``n`` rows drawn from ``N`` holds at most
        about that many, the 95% bound of the "rule of three"; a model far above it is refuted by the sample, and
        the fit's answer is the sample's) and ``E[y yᵀ]`` the group's sample rows' (each key's value, the
        non-NULL indicator, 1 for the row count; not centred on the box's rows, whose mean is unknown): an AVG
        gains the group's spread about the answer over the model's rows. A group sampled whole, or whose box
        holds a sample row, adds nothing. It is added to the residuals' and placement's variance (a box cutting a
        bin in such a group takes both), and to :meth:`_unseen_nulls`' for a non-NULL count (a small overlap:
        ``p(1 − p)`` beside ``count/N``)."""
        G = len(self.N)
        seen = rows.boxed_per_group(G)
        empty = (seen == 0) & (count > 0) & (self.n > 0) & (self.n < self.N)
        if not empty.any():
            return None
        missed = np.minimum(count, 3 * self.N / np.maximum(self.n, 1))  # the rows the sample could miss
        share = np.where(empty, missed / np.maximum(self.N, 1) / np.maximum(self.n, 1), 0.0)  # (count/N) / n
        return share[:, None, None] * self._moments(tuple(keys))

    def _unseen_bins(self, S: list[int], phis: dict, keys: list, rows: _Rows, tree: _Forest, E: list[np.ndarray],
                     memo: dict | None = None) -> np.ndarray | None:
        """(G, K, K) or None: per unit of a group's expansion ``N²(1 − n/N)/n``, the variance of the keys' totals
        from the rows of fine bins of a predicate column that hold rows of the group and none of its sample rows,
        where the box's share of such a bin differs from the share a coarser cell of the column gives it.

        With two or more predicate columns the fit's terms include the model's prediction from another column's
        fine bin (:meth:`_auxiliaries`), which sees ``u`` only through a pair grid's cells of ``u`` (or, with no
        pair to the other predicates, ``u``'s share over the whole group): it gives every row of a cell the
        cell's mean share ``φ̄_c``, where the row's own bin has ``φ_b``. The residuals of the group's sample rows
        show that gap bin by bin, but not in a bin none of them lies in: lineitem's ``l_shipdate >= '1996-08-31'
        AND l_commitdate < '1998-10-29' GROUP BY l_linestatus`` drops the 250 rows of commitdate's last three
        days, none of them among the group's 10,221 sample rows; the fit took the other rows of their cell, each
        predicted ``1 − 0.0015``, as evidence of a higher count and answered 1,907,270 ± 25 against 1,907,025
        (the model's own prediction, exact there).

        Had the sample drawn its share of such a bin's ``N_gb`` rows, their residuals ``(φ_b − φ̄_c)`` times the
        share ``o_gb`` of them the other predicates keep would be in the design's ``S²``; they are added as the
        residuals would show them, ``S²_g = Σ_b N_gb (φ_b − φ̄_c)² o_gb² / N_g`` over the group's unseen bins (the
        largest gap over ``u``'s pair grids with the other predicates), along each key's uncentred second moment
        among the group's sample rows (1 for the row count), as :meth:`_unsampled_box` does. ``o_gb`` is the
        model's, given the bin: the messages to ``u``'s bin through the pair grids of the query's tree
        (:meth:`_incoming`, from the box's ``memo``), times the other components' expectations (the group's
        average keep share in its place left the late commit days, all shipped late, at a half and a seventh of
        their variance). A bin some sample row of the group lies in, a group sampled whole and one predicate
        column add nothing, nor does ``u`` where every
        stored pair grid of ``u`` with another predicate is at ``u``'s full resolution (the gap is the largest
        over all of them, used by the fit's tree or not: the larger bound), nor a group whose box holds none of
        its sample rows: :meth:`_unsampled_box` takes all of its box's rows as unseen already. The term moves
        no estimate: the answer keeps the fit's lean on the coarse term, and the interval holds it."""
        if len(S) < 2:
            return None
        G = len(self.N)
        s2 = np.zeros(G)
        boxed = rows.boxed_per_group(G) > 0
        for u in S:
            missing = self._missing_bins(u)
            if not missing.any():
                continue
            ph = np.broadcast_to(phis[u], self.fine[u].shape)
            gap = self._cell_share_gap(u, S, ph)
            ci = tree.comp_of[u]
            others = np.prod([E[c] for c in range(len(E)) if c != ci], axis=0) if len(E) > 1 else 1.0
            kept = self._incoming(u, None, tree.adj, phis, memo) * np.reshape(others, (-1, 1))  # o_gb
            s2 += (missing * self.fine[u] * gap * kept ** 2).sum(axis=1)
        s2 *= boxed / np.maximum(self.N, 1)
        if not s2.any():
            return None
        return (s2 / np.maximum(self.n, 1))[:, None, None] * self._moments(tuple(keys))

    def _cell_share_gap(self, u: int, S: list[int], ph: np.ndarray) -> np.ndarray:
        """(G, B_u + 1): per group and fine bin of ``u``, the largest ``(φ_b − φ̄_c)²`` over the stored pair grids
        of ``u`` with another predicate column of ``S`` (``φ̄_c`` the count-weighted mean share of the bin's cell
        in the grid's map of ``u``), or against the group's share over all of ``u`` where no such grid is
        stored (:meth:`_unseen_bins`)."""
        gaps = []
        for (a, b), pair in self.pairs.items():
            if u not in (a, b) or (b if a == u else a) not in S:
                continue
            d = 0 if a == u else 1
            mean = self._cell_mean(u, ph, pair.starts[d]).take(pair.maps[d], axis=1)
            gaps.append((ph - mean) ** 2)
        if not gaps:
            w = self.fine[u]
            whole = (w * ph).sum(axis=1) / np.maximum(w.sum(axis=1), 1)
            gaps.append((ph - whole[:, None]) ** 2)
        return np.maximum.reduce(gaps)

    def _missing_bins(self, u: int) -> np.ndarray:
        """(G, B_u + 1): 1 where a group has rows in a fine bin of ``u`` and its sample none (not the NULL bin, nor
        a group sampled whole); computed once per column."""
        got = self._missing_cache.get(u)
        if got is None:
            G, B1 = self.fine[u].shape
            b = self._sample_bins()[:, u]
            seen = np.bincount(self.s_gid * B1 + b, minlength=G * B1).reshape(G, B1)
            got = ((self.fine[u] > 0) & (seen == 0)).astype(np.float64)
            got[:, 0] = 0.0
            got[self.n >= self.N] = 0.0  # sampled whole
            self._missing_cache[u] = got
        return got

    def _unseen_moments(self, u: int, keys: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For :meth:`_unseen_values`: (G, B_u + 1), 1 where a group has rows in a fine bin of ``u`` and its sample
        none (not the NULL bin, nor a group sampled whole); (B_u + 1, K, K), each bin's ``E[e eᵀ]`` over the whole
        sample; (G, K, K), each group's over its own rows; (G, B_u + 1), where the group's is the larger (trace).
        Cached per column and keys (none of it depends on the query)."""
        got = self._unseen_cache.get((u, keys))
        if got is not None:
            return got
        G, B1 = self.fine[u].shape
        b = self._sample_bins()[:, u]
        missing = self._missing_bins(u)
        y = self._sample_values(list(keys))
        e = y - np.stack([self._sum_ratio(u, k)[self.s_gid, b] for k in keys], axis=1)
        wt = (self.N / np.maximum(self.n, 1)).take(self.s_gid)
        rows = np.bincount(b, minlength=B1)
        run = _runs(rows, POOLED_RUN_ROWS)
        moments = [_weighted_moments(at, wt, e, size) for at, size in ((b, B1), (run.take(b), run[-1] + 1))]
        # the bin's own rows (of the other groups) where the sample holds a few, else its run's
        of_bin = np.where((rows >= SEEN_SIDE)[:, None, None], moments[0], moments[1][run])  # (B1, K, K)
        of_group = _weighted_moments(self.s_gid, np.ones(len(b)), e, G)  # (G, K, K): the group's own rows
        larger = np.trace(of_group, axis1=1, axis2=2)[:, None] > np.trace(of_bin, axis1=1, axis2=2)[None, :]
        got = (missing, of_bin, of_group, larger)
        if len(self._unseen_cache) >= 64:  # stay bounded
            self._unseen_cache.pop(next(iter(self._unseen_cache)), None)
        self._unseen_cache[(u, keys)] = got
        return got

    def _bins_by_column(self) -> np.ndarray:
        """(J, n): :meth:`_sample_bins` one column's bins contiguous; computed once."""
        if self._bins_by_col is None:
            self._bins_by_col = np.ascontiguousarray(self._sample_bins().T)
        return self._bins_by_col

    def _clamp_rounded_values(self) -> None:
        """Each rounded sample value (``step`` > 0) moved into the range its fine bin's rows hold
        (``occupied_min``, ``occupied_max``), where the row's own value lies: a value rounded down from a bin's
        least value (79.3333 from 79.33333…) fell below it, and a bound there put the row on the wrong side while
        the bin, wholly on the other, left it in no doubt (:meth:`_in_part_kept_bins`). Within a step of the
        row's value still, and nearer it."""
        rounded = [j for j in range(len(self.infos)) if self.step[j] > 0]
        if not rounded:
            return
        bins = self._sample_bins()
        for j in rounded:
            info = self.infos[j]
            if len(info.occupied_min) != info.bins or len(info.occupied_max) != info.bins:
                continue
            b = bins[:, j]
            has = b > 0
            lo = info.occupied_min[b[has] - 1]
            hi = info.occupied_max[b[has] - 1]
            v = self.s_vals[has, j]
            self.s_vals[has, j] = np.where(np.isfinite(lo) & np.isfinite(hi), np.clip(v, lo, hi), v)

    def _sample_bins(self) -> np.ndarray:
        """(n, J): each sample row's fine bin per column (0 = NULL), from its stored value: as the build assigned
        it (a rounded value, build.sample_decimals, is kept in its bin)."""
        if self._s_bins is None:
            b = np.zeros(self.s_vals.shape, dtype=np.int64)
            for j, info in enumerate(self.infos):
                v = self.s_vals[:, j]
                ok = ~np.isnan(v)
                b[ok, j] = np.clip(np.searchsorted(info.edges, v[ok], side="right"), 1, info.bins)
            self._s_bins = b
        return self._s_bins

    def _rows(self, S: list[int], box: dict, phis: dict | None) -> _Rows:
        """The sample rows the query with box ``box`` over ``S`` reads.

        A row can carry a non-zero target or auxiliary only if, for some predicate column ``u``, its fine bin of
        ``u`` lies where the box's share ``phis[u]`` is non-zero or holds a value the condition accepts, widened
        to the cells of ``u``'s sum grid and of the pair grids within ``S`` (auxiliaries of a cell's mean share):
        per column a range of fine bins, whose rows are one slice of the sample sorted by that column's bin."""
        if phis is None:
            phis = {u: self._fractions(u, box[u]) for u in S}
        if self.read_all_rows or not S:
            idx = np.arange(len(self.s_gid))
        else:
            slices = []
            for u in S:
                lo, hi = self._bin_range(u, box[u], phis[u], S)
                order, sorted_bins = self._sorted_by_bin(u)
                a, b = np.searchsorted(sorted_bins, [lo, hi + 1], side="left")
                slices.append(order[a:b])
            if len(slices) == 1:
                idx = np.sort(slices[0])
            else:
                mask = np.zeros(len(self.s_gid), dtype=bool)
                for sl in slices:
                    mask[sl] = True
                idx = np.flatnonzero(mask)
        rows = _Rows(idx, self.s_gid[idx], self._vals_by_col, self._bins_by_column(), self._cell_index,
                     self._centre_of)
        for u in S:
            match = rows.match[u] = self._row_match(u, box[u], rows.vals(u))
            rows.inside = match if u == S[0] else rows.inside & match
        return rows

    def _bin_range(self, u: int, ivals: list, ph: np.ndarray, S: list[int]) -> tuple[int, int]:
        """The fine bins of ``u`` (first, last) holding every sample row the query may need (:meth:`_rows`)."""
        info = self.infos[u]
        hit = np.flatnonzero(np.asarray(ph).reshape(-1))
        los, his = [int(hit[0])] if len(hit) else [], [int(hit[-1])] if len(hit) else []
        top = max(info.bins, 1)
        for lo, _, hi, _ in ivals:  # the bins a value the condition accepts falls in, as _sample_bins assigns them
            b_lo, b_hi = info.edges.searchsorted([lo, hi], side="right").tolist()
            los.append(min(max(b_lo, 1), top))
            his.append(min(max(b_hi, 1), top))
        if not los:
            return 1, 0  # no bin
        lo, hi = min(los), max(his)
        maps = [("sum", u)] + [(p, p.index(u)) for p in self.pairs if u in p and p[0] in S and p[1] in S]
        first, last = lo, hi
        for m in maps:
            starts_of, ends_of = self._cells(m)
            first, last = min(first, int(starts_of[lo])), max(last, int(ends_of[hi]))
        return first, last

    def _cells(self, which: tuple) -> tuple[np.ndarray, np.ndarray]:
        """Per fine bin, the first and last fine bin of its cell in a map: ``("sum", u)`` the sum grid of ``u``,
        ``((a, b), d)`` dimension ``d`` of the pair grid of ``(a, b)``."""
        got = self._cell_bounds.get(which)
        if got is None:
            cmap = self.sums[which[1]][0] if which[0] == "sum" else self.pairs[which[0]].maps[which[1]]
            starts = _starts(np.asarray(cmap))  # maps are monotone: a cell is a run of fine bins
            run = np.searchsorted(starts, np.arange(len(cmap)), side="right") - 1
            got = self._cell_bounds[which] = (starts[run], np.append(starts[1:], len(cmap))[run] - 1)
        return got

    def _cell_index(self, j: int) -> np.ndarray:
        """(n,): per sample row ``g·(B_j + 1) + b``, its group ``g`` and its fine bin ``b`` of column ``j``: an
        index into a (G, B_j + 1) table. Computed once per column."""
        got = self._cell_indexes.get(j)
        if got is None:
            got = self._cell_indexes[j] = self.s_gid * self.fine[j].shape[1] + self._bins_by_column()[j]
        return got

    def _sorted_by_bin(self, u: int) -> tuple[np.ndarray, np.ndarray]:
        """The sample's positions ordered by their fine bin of ``u``, and those bins."""
        got = self._bin_order.get(u)
        if got is None:
            b = self._sample_bins()[:, u]
            order = np.argsort(b, kind="stable")
            got = self._bin_order[u] = (order, b[order])
        return got

    def support(self, q: Query) -> np.ndarray:
        """(G,): per synopsis group, the sample rows inside the query's box, or ``inf`` where the answer does not
        rest on the sample (the whole group is sampled, or the query has no predicate).

        The interval's width is estimated from these rows; with very few of them it is itself uncertain
        (:data:`MIN_SUPPORT`), which the engine reports in ``df.attrs["warnings"]``.
        """
        box, _ = self._box(q)
        S, empty = self._predicate_columns(box)  # as estimate() reads the box
        return np.where(empty, np.inf, self._support(self._rows(list(S), box, None) if S else None))

    def _support(self, rows: _Rows | None) -> np.ndarray:
        """(G,): :meth:`support` from the query's sample rows (None: the query has no predicate)."""
        if rows is None:
            return np.full(len(self.N), np.inf)
        G = len(self.N)
        if G <= FEW_GROUPS:  # the rows are in sample order, so by group: a count per group's slice
            bounds = rows.gid.searchsorted(np.arange(G + 1)).tolist()
            got = np.array([np.count_nonzero(rows.inside[a:b]) for a, b in itertools.pairwise(bounds)], dtype=float)
        else:
            got = np.bincount(rows.gid, rows.inside, minlength=G).astype(np.float64)
        return np.where(self.n >= self.N, np.inf, got)

    def _root_message(self, u: int, tree: _Forest, factors: dict, memo: dict | None = None) -> np.ndarray:
        """(G, B_u + 1): the model's expectation of the product of ``factors`` over ``u``'s component given
        ``u``'s fine bin, times the bin's own factor."""
        return self._lam(u, None, tree.adj, factors, memo)

    def _auxiliaries(self, key, S, phis, kp, tree: _Forest, rows: _Rows, memo: dict, box_memo: dict, slot: int = 0
                     ) -> Auxiliaries:
        """The key's auxiliary functions on the query's sample rows ``rows``: each a function of one fine bin,
        one pair grid's cells or one sum grid's cells whose population total per group the synopsis holds
        exactly. The dense terms are written straight into the fit's design (row 0 its intercept), valid until this
        thread's next query. ``memo`` keeps the messages under the key's factors ``kp``, ``box_memo`` those under
        the box's own ``phis`` (the row-count key's, computed first). ``S``: the predicate columns, the one whose
        prediction is the fit's base first (:func:`_least_cut_first`; a SUM or AVG of a predicate column puts its
        own column first)."""
        G = len(self.N)
        kind, j = key
        pairs = [(cols, pair) for cols, pair in self.pairs.items() if cols[0] in kp and cols[1] in kp]
        shape = (1 + 2 * len(S) + len(pairs) + 1, len(rows.idx))
        # the design in memory this thread keeps for its next query (a fresh one costs its pages' first-touch faults)
        X = scratch(f"design{slot}", shape) if slot < SCRATCH_SLOTS else np.empty(shape)
        X[0] = 1.0
        t = 1
        tots, sparse, sparse_tots = [], [], []
        Ek = [self._expect(comp, tree.adj, kp, memo) for comp in tree.comps] if len(tree.comps) > 1 else []
        own = j if kind in SUM_KINDS and j in phis else None  # a SUM or AVG of a predicate column
        for u in ([own] + [u for u in S if u != own]) if own is not None else S:
            # the model's prediction given u's fine bin (all roots share the model's total); the first is the
            # difference estimator's (estimator module)
            ci = tree.comp_of[u]
            others = np.prod([Ek[c] for c in range(len(Ek)) if c != ci], axis=0)[:, None] if len(Ek) > 1 else 1.0
            f = self._root_message(u, tree, kp, memo) * others
            refine = self._end_rows(u, phis[u], rows)
            if u == own:  # the row's own value where f has its bin's mean (_own_value_term)
                m = self._own_value_term(key, u, tree, phis, rows, others, box_memo, X[t])
                total = self._value_factor(key) * m  # per bin: the bins' sums times the count's message
            else:
                rows.at(f, u, out=X[t])
                total = f
            if refine is not None:  # the rows of bins cut at an end by their own place in the box, whose totals
                pos, factor = refine  # f holds (the ends' rows at their own values; with groups, their shares)
                X[t, pos] *= factor
                total = np.where(np.r_[False, rows.ends[u].end_cut] & self._partial[:, None], f, total)
            tots.append((self.fine[u] * total).sum(axis=1))
            t += 1
            for pos, vals, tot in self._edge_terms(u, phis[u], f, rows):
                sparse.append((pos, vals))
                sparse_tots.append(tot)
        for (a, b), pair in pairs:  # the product of the box's cell shares on each stored pair
            qa = self._cell_mean(a, kp[a], pair.starts[0])
            qb = self._cell_mean(b, kp[b], pair.starts[1])
            np.multiply(rows.at(qa, a, pair.maps[0]), rows.at(qb, b, pair.maps[1]), out=X[t])
            t += 1
            tots.append(np.bincount(pair.gid, pair.n * qa.take(pair.flat[0]) * qb.take(pair.flat[1]), minlength=G))
        if kind != "n":  # the row's own value times its cell's box share, through each predicate's sum grid
            v = rows.key_values(key)
            for u in S:
                cmap, tot = self.sums[u]
                if (kind, j) not in tot:
                    continue
                if u == j and self._end_rows(j, phis[j], rows) is not None:
                    continue  # its cell shares would put back the end rows the own-column terms leave out
                q = self._cell_mean(u, phis[u], self._sum_starts(u))
                np.multiply(v, rows.at(q, u, cmap), out=X[t])
                t += 1
                tots.append((q * tot[(kind, j)]).sum(axis=1))
            if j in phis and kind in SUM_KINDS:  # the own column: exact per-fine-bin sums
                ph = np.broadcast_to(phis[j], (self.fine[j].shape[1],))
                np.multiply(v, ph.take(rows.bins(j)), out=X[t])
                factor = self._value_factor(key) * ph
                refine = self._end_rows(j, phis[j], rows)
                if refine is not None:  # the rows of bins cut at an end by their own place in the box
                    pos, own_share = refine
                    X[t, pos] *= own_share
                    factor[:, 1:] = np.where(rows.ends[j].end_cut & self._partial[:, None], kp[j][:, 1:],
                                             factor[:, 1:])
                t += 1
                tots.append((self.fine[j] * factor).sum(axis=1))
        return Auxiliaries.from_design(X[:t], np.stack(tots + sparse_tots, axis=1), sparse)

    def _own_value_term(self, key, u: int, tree: _Forest, phis: dict, rows: _Rows, others, box_memo: dict,
                        out: np.ndarray) -> np.ndarray:
        """For a SUM or AVG key of the predicate column ``u``: the model's prediction with each row's own value in
        place of its fine bin's mean, written into ``out``. The model's message at ``u`` is the bin's mean value
        times the count's message (the box's share and the other columns' expectations given the bin), so the
        term's total is the same, exact from the fine bins' sums; but where the box keeps whole bins of ``u`` and
        has no other predicate it *is* the row's ``y`` and the answer is exact, where the bin's mean left the
        difference estimator every row's departure from it (a heavy-tailed count: ``SUM(visits) WHERE visits >=
        2`` on the synthetic table, values 1 to 10,000, was percents off)."""
        m = self._root_message(u, tree, phis, box_memo) * others  # per unit of value: the count's message
        np.multiply(rows.key_values(key), rows.at(m, u), out=out)
        return m

    def _end_rows(self, u: int, ph: np.ndarray, rows: _Rows) -> tuple[np.ndarray, np.ndarray] | None:
        """For a bin of ``u`` that the box cuts at one of its ends only (:attr:`_Ends.end_cut`), its rows' share of
        the box is known row by row: a row at an end is in the box or not, a row between the ends is in (or out)
        with all the others. Returns the positions of the query's sample rows in such bins and the factor that
        turns the bin's share ``ph`` into the row's own (0 or 1/ph); None where there are none. The build counts the
        ends' rows in the whole table: with one group the terms' totals are exact, with several the groups' shares
        of them add up to the table's (the Bernoulli placement variance of the bin stays for each group's part).
        Only in groups the sample does not hold whole (``_partial``). Computed once per query and column."""
        if u in rows.end_rows:
            return rows.end_rows[u]
        parts, got = rows.ends.get(u), None
        if parts is not None and parts.end_cut.any():
            b = rows.bins(u)
            pos = np.flatnonzero(parts.end_cut.take(np.maximum(b - 1, 0)) & (b > 0) & self._partial.take(rows.gid))
            if len(pos):
                i = b[pos] - 1
                v = rows.vals(u)[pos]
                own = np.where(v == parts.vmin[i], parts.in_lo[i],
                               np.where(v == parts.vmax[i], parts.in_hi[i], parts.inner[i]))
                got = pos, own / np.asarray(ph).reshape(-1)[i + 1]
        rows.end_rows[u] = got
        return got

    def _edge_terms(self, u: int, ph: np.ndarray, f: np.ndarray,
                    rows: _Rows) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per fine bin of ``u`` the box cuts (:meth:`_edge_bins`), an auxiliary linear in the row's position within
        the bin, ``(x − lo)/width − ½``, times the model's prediction per unit of box share: its total is exact from
        the bin's stored count and sum. It lets the regression learn on which side of the bin the box's edge keeps
        rows, where the bin's share alone treats every row of the bin alike. A sparse term (0 outside its bin):
        the positions in ``rows`` of the bin's rows, the values there, the totals."""
        if u not in rows.edges:
            rows.edges[u] = self._edge_bins(u, ph, rows)
        ph = np.asarray(ph).reshape(-1)
        out = []
        for e in rows.edges[u]:
            ratio = f[:, e.b] / ph[e.b]  # (G,): the model's prediction for the bin per unit of box share
            out.append((e.at, e.position * ratio[e.gid], ratio * e.position_total))
        return out

    def _edge_bins(self, u: int, ph: np.ndarray, rows: _Rows) -> list[_EdgeBin]:
        """The fine bins of ``u`` the box's shares ``ph`` cut (at most :data:`MAX_EDGE_TERMS`; none for a discrete
        column or a bin of one value) on the query's sample rows: the same for every key."""
        info = self.infos[u]
        ph = np.asarray(ph).reshape(-1)
        cut = np.flatnonzero((ph > 1e-12) & (ph < 1 - 1e-12))
        cut = cut[cut > 0]
        parts = rows.ends.get(u)
        if parts is not None and len(self.N) == 1:  # cut at an end only: its rows are where the build counted
            cut = cut[~parts.end_cut[cut - 1]]  # them, none to place (with groups, shared among them)
        if info.discrete or not 0 < len(cut) <= MAX_EDGE_TERMS:
            return []
        lower, upper, point = self._spread(u)
        v, gi = rows.vals(u), rows.gid
        sums = self._bin_sums(u)
        out = []
        for b in cut:
            lo, width = lower[b - 1], upper[b - 1] - lower[b - 1]
            if point[b - 1] or not width > 0:
                continue
            at = rows.position(self._bin_rows(u, b))  # the bin's sample rows
            n_b = self.fine[u][:, b]
            position = (v[at] - lo) / width - 0.5
            # positions that are round-off (every sample row of the bin at its middle, say) are 0: a term of
            # values ~1e-15 among the rows but a total of 1.5 took a coefficient that put a count at 7e13 (olympics)
            position[np.abs(position) <= 1e-9] = 0.0
            out.append(_EdgeBin(int(b), at, gi[at], position, (sums[:, b] - lo * n_b) / width - 0.5 * n_b))
        return out

    def _sum_starts(self, u: int) -> np.ndarray:
        """The first fine bin of each cell of ``u``'s sum grid; computed once."""
        got = self._sum_start_cache.get(u)
        if got is None:
            got = self._sum_start_cache[u] = _starts(self.sums[u][0])
        return got

    def _bin_sums(self, u: int) -> np.ndarray:
        """(G, B_u + 1): per group and fine bin of ``u``, the sum of ``u``'s values (0 where none); computed
        once."""
        got = self._bin_sum_cache.get(u)
        if got is None:
            got = self._bin_sum_cache[u] = np.nan_to_num(self.fine[u] * self.mean[u])
        return got

    def _placement(self, S, phis, box, ends: dict | None = None, rows: _Rows | None = None,
                   split: dict[int, np.ndarray] | None = None, grouping: list[str] | None = None
                   ) -> dict[int, np.ndarray]:
        """Per predicate column ``u`` (those with a cut bin), (G, B_u + 1): each fine bin's part of the relative
        variance of the count from rows placed evenly within the fine bins the box cuts (Bernoulli placement plus
        the squared disagreement with a linear density through the neighbouring bins): the part of the error in
        rows the sample may not see, which :func:`interval_variance` sets against the residual variance. With one
        group, the rows at a bin's ends (:meth:`_shares`) are where the build counted them: only the rows between
        are placed. Given the query's sample rows ``rows``, a bin counts only in the groups whose sample rows
        there are too few for the residuals to hold its error (:meth:`_unseen`). :meth:`_placement_moments` weighs
        each bin's part by what the rows there add to the answer. The density's shape within a bin adds its own
        part, measured by the build for answers split by ``grouping`` (:meth:`_shape_error`)."""
        G = len(self.N)
        out = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            for u in S:
                w, ph = self.fine[u], phis[u]
                if not np.any((ph > 0) & (ph < 1)):
                    continue  # no cut bin, nothing to weigh (no Bernoulli or slope part)
                share, placed = ph, w
                parts = (ends or {}).get(u)
                if G == 1 and parts is not None:  # only the rows between the bins' ends are placed
                    share = ph.copy()
                    share[1:] = np.where(parts.known, parts.inner, ph[1:])
                    placed = w.copy()
                    placed[:, 1:] *= np.where(parts.known, parts.spread, 1.0)
                unseen = self._unseen(u, rows)  # which groups' sample sees the cut bins
                # rows that share a value move together: the values' counts vary φ times as much as rows' would.
                # Not below the rows' own where a bin is cut at an end in a grouped synopsis: there it is the split
                # of the end's rows (counted in the whole table) among the groups that is placed, row by row
                disp = np.full(w.shape, self._dispersion(u))
                if G > 1 and parts is not None:
                    disp[:, 1:] = np.where(parts.end_cut & self._partial[:, None], np.maximum(disp[:, 1:], 1.0),
                                           disp[:, 1:])
                if split is not None and u in split:  # the ends' split is its own term (_end_splits): here only
                    # which of the bin's rows are at the end, row by row (_placement_moments centres their values)
                    disp[:, 1:] = np.where(split[u] & self._partial[:, None], 1.0, disp[:, 1:])
                bern = share * (1 - share) * placed
                num = bern * disp * unseen + self._slope_var(u, box[u], unseen)
                kappa = self._shape_error(u, grouping)
                if kappa > 0:
                    shape = kappa * bern * placed * self._unseen_by_sample(u, rows)
                    if parts is not None:  # only where the box cuts between a bin's ends (not at an end only)
                        shape[:, 1:] *= ~parts.known | ((parts.inner > 0) & (parts.inner < 1))
                    num = num + shape
                den = (w * ph).sum(axis=1)
                out[u] = np.where(den[:, None] > 0, num / np.where(den > 0, den, 1)[:, None] ** 2, 0.0)
        return out

    def _shape_error(self, u: int, grouping: list[str] | None) -> float:
        """``κ``: the relative variance of a cut bin's count from the density's shape within the bin, beyond its
        slope, for answers split by ``grouping``: the build's measurement on the whole table
        (:func:`~densitas.aqp.build.placement_error`; 0 where it took none). The placement variance adds
        ``κ·p(1 − p)·n²`` for a bin's ``n`` placed rows of which the box takes the share ``p``, where the whole
        query sample sees the bin too little to correct it (:meth:`_unseen_by_sample`).

        The sample's ties (:meth:`_dispersion`) see rows that share a value; TPC-H's ``l_extendedprice`` (a
        quantity times a price) also clusters between its values within its bins: its cut bins' counts were off
        by ~115 rows of ~2,000 against a tie-based ±35, and 78% of the 95% intervals of one-column counts on it
        covered (RESULTS, twenty-sixth session)."""
        measured = stored_placement(self.infos[u], grouping)
        return 0.0 if measured is None else measured

    def _dispersion(self, u: int) -> float:
        """How much more (or less) the count of a cut bin's part varies than if its rows had been placed one
        by one (the index of dispersion ``φ``: a bin's ``n_b`` placed rows over its ``V_b`` values have counts of
        mean ``μ = n_b/V_b`` and variance ``φμ``, and the Bernoulli variance of a cut's count is ``p(1 − p)·φ·n_b``).
        Rows each at a value of its own, or scattered at random, give ``φ = 1``; a column whose every value holds as
        many rows (a day's flights) ``φ ≈ 0``, an even spread being then right; rows repeating a few values (a
        patient's id on each visit) ``φ`` up to their repeats.

        From the sample's pairs of rows that share a value, an unbiased estimate of ``Σ_v c(c − 1) = (φ − 1)·n +
        Σ_b n_b²/V_b`` over the rows an even spread places: not those of a bin of one value, nor those at a bin's
        ends where the build counted them (a value on most rows would set φ for every bin). Pooled over the groups,
        and moved towards 1 by its own standard error (the ties seen are few where the sample is small against the
        table: each moves the estimate by ``2n/m²``). 1 for a column whose sample values are rounded more coarsely
        than its own values (ties the rounding made).

        Examples
        --------
        >>> import duckdb, numpy as np, pandas as pd
        >>> from densitas.aqp import Engine
        >>> con = duckdb.connect()
        >>> _ = con.register("df", pd.DataFrame({"x": np.repeat(np.arange(0, 4000, 2), 5)}))  # 5 rows a value
        >>> _ = con.execute("CREATE TABLE t AS SELECT * FROM df")
        >>> eng = Engine(con)
        >>> _ = eng.build("t", columns=["x"], max_bins=16, sample_size=2000, seed=1)
        >>> phi = eng._load("t")._dispersion(0)        # every other integer, 5 rows each: counts 0, 5, 0, 5, …
        >>> bool(2.0 < phi < 3.2)                      # mean 2.5, variance 6.25: φ = 2.5
        True
        """
        if u in self._dispersion_cache:
            return self._dispersion_cache[u]
        G = len(self.N)
        phi = 1.0
        step = self.step[u]
        if step == 0 or step <= self.infos[u].step:  # the sample holds the values as they are
            placed, values, keep = self._evenly_placed(u)
            v = self.s_vals[:, u]
            b = self._sample_bins()[:, u]
            ok = ~np.isnan(v) & keep[b]
            ends = self._ends(u)
            if ends is not None:  # rows at a bin's known ends are where the build counted them
                at_end = ends.known[b - 1] & ((v == ends.vmin[b - 1]) | (v == ends.vmax[b - 1]))
                ok &= ~(at_end & (b > 0))
            gid = self.s_gid[ok]
            m = np.bincount(gid, minlength=G).astype(np.float64)
            n = placed.sum(axis=1)
            fit = (m > 1) & (n > 1)
            if fit.any():
                with np.errstate(invalid="ignore", divide="ignore"):
                    scale = np.where(fit, n * (n - 1) / (m * (m - 1)), 0.0)
                    pairs, triples = _pairs_per_group(gid, v[ok], G)
                    even = (placed ** 2 / values).sum(axis=1)
                    # each value's sample count m ~ Poisson: Var m(m − 1) = 4λ³ + 2λ², estimated unbiasedly by
                    # 4·m(m − 1)(m − 2) + 2·m(m − 1); the pairs at least as many as rows placed one by one would give
                    spread = 4 * triples + 2 * np.maximum(pairs, even / np.where(fit, scale, 1))
                total = n[fit].sum()
                excess = ((pairs * scale)[fit].sum() - even[fit].sum()) / total
                error = np.sqrt((spread * scale ** 2)[fit].sum()) / total
                phi = float(max(1 + np.sign(excess) * max(abs(excess) - error, 0.0), 0.0))
        self._dispersion_cache[u] = phi
        return phi

    def _evenly_placed(self, u: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``u`` an even spread places: per group and fine bin (G, B_u), those between the bin's ends
        where the build counted them (all its rows elsewhere), none in a bin of one value; the values they spread
        over (B_u,: the width over the column's step, inf for floats, whose values fall on no grid); and which fine
        bins (bin 0, NULL, included: B_u + 1) hold any."""
        lower, upper, point = self._spread(u)
        placed = self.fine[u][:, 1:].copy()
        width = upper - lower
        ends = self._ends(u)
        if ends is not None:
            placed *= np.where(ends.known, ends.spread, 1.0)
            width = np.where(ends.known, ends.inner_width, width)
        step = self.infos[u].step
        values = np.maximum(width / step, 1.0) if step > 0 else np.full(len(width), np.inf)
        placed[:, point] = 0.0
        keep = np.r_[False, ~point]
        return placed, values, keep

    def _split_dispersion(self, S: list[int], ends: dict, grouping: list[str] | None) -> dict[int, np.ndarray]:
        """Per predicate column ``u`` with bins the box cuts at an end only (``_Ends.end_cut``), in a synopsis of
        several groups: (2, 2, B_u) the measured dispersion of the split of each such bin's low and high end's
        rows, first among the classes of the query's ``grouping``, then among all the groups
        (:func:`~densitas.aqp.build.end_dispersion`; the largest measured for a set of group columns not measured),
        NaN elsewhere. Columns without measurements (an older
        synopsis) are left out: their ends keep the row-by-row placement (:meth:`_placement`)."""
        out: dict[int, np.ndarray] = {}
        if len(self.N) == 1 or grouping is None:
            return out
        for u in S:
            parts, info = ends.get(u), self.infos[u]
            if parts is None or parts.end_cut is None or not parts.end_cut.any() or not info.end_dispersion:
                continue
            # no grouping: the groups' rows at each end add up to the table's
            d = stored_dispersion(info, grouping) if grouping else np.zeros((2, len(parts.end_cut)))
            full = stored_dispersion(info, self.group_by)  # among all the groups
            out[u] = np.where(parts.end_cut[None, None, :], np.stack([d, full]), np.nan)
        return out

    def _split_applied(self, u: int, disp: np.ndarray, parts: _Ends, alone: bool) -> np.ndarray:
        """(G, B_u): the groups and bins whose answers take the model's split of the cut ends' rows, so that their
        error in those rows is the split's (:meth:`_end_splits`): every group where ``u`` is the query's only
        predicate column (the model's prediction is then the fit's, its rows at the ends held by their own
        places); with others, the groups with at least :data:`SEEN_SIDE` sample rows at each cut end of the bin,
        from which the fit learns the ends' rows (with fewer, it may leave them to the other columns' terms and
        answer as if none were cut: those keep the row-by-row placement, :meth:`_placement`)."""
        G = len(self.N)
        cut = np.isfinite(disp).any(axis=0)
        if alone:
            return np.broadcast_to(cut, (G, len(cut))).copy()
        ok = np.broadcast_to(cut, (G, len(cut))).copy()
        for b in np.flatnonzero(cut):  # the cut bins' sample rows only
            idx = self._bin_rows(u, b + 1)
            v = self.s_vals[idx, u]
            for side, (value, inside) in enumerate(((parts.vmin, parts.in_lo), (parts.vmax, parts.in_hi))):
                if inside[b] != parts.inner[b] and np.isfinite(disp[side, b]):  # this end is cut
                    seen = np.bincount(self.s_gid[idx[v == value[b]]], minlength=G)
                    ok[:, b] &= seen >= SEEN_SIDE
        return ok

    def _end_splits(self, phis: dict, ends: dict, keys: list, count: np.ndarray,
                    dispersion: dict[int, np.ndarray], applied: dict[int, np.ndarray]) -> list[_EndSplit]:
        """One :class:`_EndSplit` per end of a bin the box cuts at an end only, where its split among the groups
        is measured (:meth:`_split_dispersion`): the end's rows times that dispersion, each group's share of the
        bin's rows, and what one of its rows moved across the cut adds to each key's total (G, K): ±1 for a row
        count, the end's own value for the column's sums, the group's mean of the others among its sample rows
        in the bin (its mean anywhere with fewer than :data:`SEEN_SIDE` there), scaled by the share of the
        group's rows in the column's range that the rest of the box keeps. Groups the sample holds whole have
        their rows where they are: 0."""
        out = []
        for u, disp in dispersion.items():
            parts, w = ends[u], self.fine[u]
            nb = w[:, 1:].sum(axis=0)
            den = (w * phis[u]).sum(axis=1)  # each group's rows in u's range
            with np.errstate(invalid="ignore", divide="ignore"):
                rest = np.where(den > 0, count / np.where(den > 0, den, 1.0), 0.0) * self._partial
            counts = (self.infos[u].count_at_min, self.infos[u].count_at_max)
            values = (parts.vmin, parts.vmax)
            inside = (parts.in_lo, parts.in_hi)
            for b in np.flatnonzero(np.isfinite(disp[0]).any(axis=0)):
                mean = None
                for side in (0, 1):
                    kappa = inside[side][b] - parts.inner[b]  # +1: the end's rows are in the box, the rest not
                    c, d = float(np.nan_to_num(counts[side][b])), disp[0, side, b]
                    if kappa == 0 or c <= 0 or not np.isfinite(d) or nb[b] <= 0:
                        continue
                    if mean is None:
                        mean = self._bin_means(u, b + 1, keys)
                    per_row = mean.copy()
                    for t, (kind, j) in enumerate(keys):
                        if j == u:
                            per_row[:, t] = values[side][b] - self._centre_of((kind, j)) if kind in SUM_KINDS \
                                else 1.0
                    per_row *= (kappa * rest * applied[u][:, b])[:, None]
                    within = disp[1, side, b] if np.isfinite(disp[1, side, b]) else d
                    out.append(_EndSplit(c * d, w[:, b + 1] / nb[b], per_row, c * within))
        return out

    def _bin_means(self, u: int, b: int, keys: list) -> np.ndarray:
        """(G, K): per group, each key's mean value (before the box) among its sample rows in fine bin ``b`` of
        ``u``, or among all its sample rows where fewer than :data:`SEEN_SIDE` lie there; 1 for a row count. Cached
        per column, bin and keys (the placement's centring and the split's term of one query both ask)."""
        ck = (u, b, tuple(keys))
        got = self._bin_mean_cache.get(ck)
        if got is not None:
            return got
        G, K = len(self.N), len(keys)
        got = self._moments(tuple(keys), first=True) / np.maximum(self.n, 1)[:, None]
        idx = self._bin_rows(u, b)
        if len(idx):
            gid = self.s_gid[idx]
            yb = self._sample_values(keys, self.s_vals[idx])
            m = np.bincount(gid, minlength=G).astype(np.float64)
            own = np.stack([np.bincount(gid, yb[:, t], minlength=G) for t in range(K)], axis=1) \
                / np.maximum(m, 1)[:, None]
            got = np.where((m >= SEEN_SIDE)[:, None], own, got)
        if len(self._bin_mean_cache) >= 256:  # stay bounded
            self._bin_mean_cache.pop(next(iter(self._bin_mean_cache)))
        self._bin_mean_cache[ck] = got
        return got

    def _bin_rows(self, u: int, b: int) -> np.ndarray:
        """The positions of the sample rows in fine bin ``b`` of ``u``."""
        order, sorted_bins = self._sorted_by_bin(u)
        lo, hi = np.searchsorted(sorted_bins, [b, b + 1], side="left")
        return order[lo:hi]

    def _placement_moments(self, parts: dict[int, np.ndarray], keys: list,
                           split: dict[int, np.ndarray] | None = None) -> np.ndarray:
        """(G, K, K): the placement variance's relative parts per cut bin (:meth:`_placement`) weighed by the
        keys' second moments ``E[y yᵀ]`` among the rows of that bin: the rows a cut moves carry the values of
        their bin, not of their whole group (a SUM of a heavy-tailed column cut near its small values moved rows
        worth the group's largest, and population's intervals came out 5–10 times too wide). Each group's own
        sample rows in the bin where there are at least :data:`SEEN_SIDE` of them. Else, for the keys the bin
        itself determines (a row count, or the values of ``u`` itself) the group's rows in the bin, at their mean
        value (the fine bins' sums) and spread evenly over the bin, and for the others (another column's values,
        which differ from group to group) the group's sample rows anywhere."""
        G, K = len(self.N), len(keys)
        out = np.zeros((G, K, K))
        if not parts:
            return out
        overall = self._moments(tuple(keys)) / np.maximum(self.n, 1)[:, None, None]
        for u, rel in parts.items():
            of_bin = np.array([kind == "n" or j == u for kind, j in keys])
            values = np.array([kind in SUM_KINDS and j == u for kind, j in keys])
            values = values[:, None] & values[None, :]  # (K, K): entries of u's own values
            at_mean = np.stack([np.ones(G) if kind == "n" or (kind == "nn" and j == u) else np.zeros(G)
                                for kind, j in keys], axis=1)  # (G, K): a row at the bin's mean, per bin below
            lower, upper, _ = self._spread(u)
            for b in np.flatnonzero((rel > 0).any(axis=0)):
                for t, (kind, j) in enumerate(keys):
                    if kind in SUM_KINDS and j == u:
                        at_mean[:, t] = np.nan_to_num(self.mean[u][:, b]) - self._centre_of((kind, j))
                # the bin's rows about their mean: spread evenly over the bin, as the model places them
                spread = (upper[b - 1] - lower[b - 1]) ** 2 / 12 if b > 0 else 0.0
                fallback = np.where(of_bin[:, None] & of_bin[None, :],
                                    at_mean[:, :, None] * at_mean[:, None, :] + spread * values, overall)
                idx = self._bin_rows(u, b)
                own = np.zeros((G, K, K))
                m = np.zeros(G)
                if len(idx):
                    gid = self.s_gid[idx]
                    m = np.bincount(gid, minlength=G).astype(np.float64)
                    own = _product_sums(gid, self._sample_values(keys, self.s_vals[idx]), G)
                mean = np.where((m >= SEEN_SIDE)[:, None, None], own / np.maximum(m, 1)[:, None, None], fallback)
                if split is not None and u in split and b > 0 and split[u][:, b - 1].any():
                    # an end's split among the groups is _end_splits' term: here which of the group's rows are at
                    # the end, their values about the group's mean (none for a count or u's own values there)
                    first = self._bin_means(u, b, keys)
                    centred = mean - first[:, :, None] * first[:, None, :]
                    centred[:, values.any(axis=1) | of_bin, :] = 0.0
                    centred[:, :, values.any(axis=1) | of_bin] = 0.0
                    mean = np.where(split[u][:, b - 1, None, None], centred, mean)
                out += rel[:, b, None, None] * mean
        return out

    def _sample_values(self, keys, vals: np.ndarray | None = None) -> np.ndarray:
        """(rows, K): what each key sums on the sample rows ``vals`` (all of them by default), before the box."""
        sv = self.s_vals if vals is None else vals
        y = np.empty((len(sv), len(keys)))
        for t, (kind, j) in enumerate(keys):
            if kind == "n":
                y[:, t] = 1.0
            elif kind in SUM_KINDS:
                y[:, t] = _centred(sv[:, j], self._centre_of((kind, j)))
            else:
                y[:, t] = ~np.isnan(sv[:, j])
        return y

    def _moments(self, keys: tuple, first: bool = False) -> np.ndarray:
        """(G, K, K): per group, the sums over its sample rows of y_k·y_l (cached per key tuple); ``first``: (G, K),
        the sums of y_k."""
        got = self._moment_cache.get((keys, first))
        if got is None:
            y = self._sample_values(keys)
            G, K = len(self.N), len(keys)
            if first:
                got = np.stack([np.bincount(self.s_gid, y[:, k], minlength=G) for k in range(K)], axis=1)
            else:
                got = _product_sums(self.s_gid, y, G)
            if len(self._moment_cache) >= 64:  # key tuples are few in practice; stay bounded regardless
                self._moment_cache.pop(next(iter(self._moment_cache)))
            self._moment_cache[(keys, first)] = got
        return got

    def _kde(self, cols, box, keys):
        G = len(self.N)
        sv = self.s_vals
        w = np.ones(len(sv))
        for j in cols:
            info = self.infos[j]
            v = sv[:, j]
            if info.discrete or self.bandwidths[j] <= 0:
                w = w * self._row_match(j, box[j], v)
                continue
            h = self.bandwidths[j]
            lo_b, hi_b = info.lo, info.top
            mass = np.zeros(len(v))
            for lo, loi, hi, hii in box[j]:
                L, U = _half_open(info, lo, loi, hi, hii)
                L, U = max(L, lo_b), min(U, hi_b)
                if U > L:
                    mass += ndtr((U - v) / h) - ndtr((L - v) / h)
            norm = ndtr((hi_b - v) / h) - ndtr((lo_b - v) / h)  # truncated to the column's range
            with np.errstate(invalid="ignore", divide="ignore"):
                w = w * np.nan_to_num(mass / norm, nan=0.0)
        y = self._sample_values(keys) * w[:, None]
        scale = self.N / np.maximum(self.n, 1)
        tot = np.zeros((G, len(keys)))
        np.add.at(tot, self.s_gid, y)
        est = tot * scale[:, None]

        def var_fn(gids, ks, ws):
            out = np.zeros(len(gids))
            for t, g in enumerate(gids):
                a, b = self.s_start[g], self.s_start[g + 1]
                if b - a < 2:
                    continue
                u = sum(np.broadcast_to(wk, (len(gids),))[t] * y[a:b, k] for k, wk in zip(ks, ws, strict=True))
                out[t] = self.N[g] ** 2 * u.var(ddof=1) / (b - a) * max(0.0, 1 - (b - a) / self.N[g])
            return GroupVariances(out)

        return est, var_fn, np.full(G, np.inf), True


def _held_exactly(exact_of: np.ndarray, exact: np.ndarray | float, est: np.ndarray, var_fn, support: np.ndarray):
    """The estimate, variance function and support with the groups ``exact_of`` answered ``exact`` (G, K), or 0 (a
    condition keeps none of their rows): no variance, not resting on the sample."""
    est = np.where(exact_of[:, None], exact, est)

    def var_of(gids, ks, ws):
        return var_fn(gids, ks, ws).without(exact_of[gids])

    return est, var_of, np.where(exact_of, np.inf, support)


def _reproduced_count(t: int, K: int, pi: np.ndarray, target: np.ndarray, gid: np.ndarray, n: np.ndarray,
                      uncut: np.ndarray | bool = True) -> np.ndarray | None:
    """(G, K, K) or None: per unit of a group's expansion ``N²(1 − n/N)/n``, the variance of the row count's
    total (key ``t`` of ``K``) in the groups whose sampled rows the model gives a probability ``π`` (``pi``,
    (m,): the count's first term after the intercept) strictly between 0 and 1 of lying in the box, though they
    lie in fine bins the box keeps or drops whole on every predicate column (``uncut``, (m,)), all lie in it or
    all outside it (``target``, (m,): the count's 0/1 target). Rows of a cut bin are the placement term's
    (:meth:`Synopsis._placement`).

    Where the rows one predicate rejects among those another keeps are rare, a group's sample may hold none of
    them: every sampled row of a cell is in the box, a term that ignores that predicate (another column's
    prediction, a pair grid's cells) fits the count with no residual, and the answer takes that term's exact
    total, rejected rows included, with no variance (``COUNT(*) WHERE d >= 5 AND c >= 1``: 587 ± 0.000001 against
    576, 587 the rows with ``d = 5``). Had the sample drawn its share of them, the residuals would have shown the
    rows' own variance, ``Σ π(1 − π) / N`` over the group's rows under the model, estimated from the sampled rows
    as ``Σ_s π(1 − π) / n``; it is added to the residuals' (which are then about 0). A group whose sampled rows of
    uncertain place fall on both sides of the box keeps its residuals' variance alone.

    Examples
    --------
    >>> pi, target = np.array([0.5, 0.9, 0.9, 0.9]), np.array([1.0, 1.0, 1.0, 0.0])  # group 1 on both sides
    >>> out = _reproduced_count(0, 1, pi, target, np.array([0, 0, 1, 1]), np.array([4.0, 4.0]))
    >>> out[:, 0, 0].round(4).tolist()                          # (0.25 + 0.09) / 4; none
    [0.085, 0.0]
    """
    G = len(n)
    uncertain = (pi > 0) & (pi < 1) & uncut  # the joint's doubt, not a cut bin's
    inside = target > 0.5
    both = (np.bincount(gid, uncertain & inside, minlength=G) > 0) \
        & (np.bincount(gid, uncertain & ~inside, minlength=G) > 0)
    expected = np.bincount(gid, np.where(uncertain, pi * (1.0 - pi), 0.0), minlength=G)  # Σ_s π(1 − π)
    if not (~both & (expected > 0)).any():
        return None
    out = np.zeros((G, K, K))
    out[:, t, t] = np.where(both, 0.0, expected / np.maximum(n, 1))
    return out


def _seen(m: np.ndarray, m_in: np.ndarray, m_out: np.ndarray) -> np.ndarray:
    """Whether the sample sees a bin well enough for the residuals to hold its placement error: at least
    :data:`SEEN_ROWS` sample rows in it, and :data:`SEEN_SIDE` inside the box and as many beyond the cut."""
    return (m >= SEEN_ROWS) & (m_in >= SEEN_SIDE) & (m_out >= SEEN_SIDE)


def _sum_bounds(lo: float, hi: float, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where a SUM surely lies: over at most ``rows`` rows (each output group's) of values in ``[lo, hi]``, between
    ``min(0, rows·lo)`` (all rows in the box at ``lo``, or none) and ``max(0, rows·hi)``. A SUM of a column with no
    negative value is never below 0.

    Examples
    --------
    >>> [b.tolist() for b in _sum_bounds(2.0, 5.0, np.array([10.0, 0.0]))]
    [[0.0, 0.0], [50.0, 0.0]]
    >>> [b.tolist() for b in _sum_bounds(-1.0, 3.0, np.array([10.0]))]
    [[-10.0], [30.0]]
    """
    if not lo <= hi:  # no range known: no bound
        return np.full(len(rows), -np.inf), np.full(len(rows), np.inf)
    with np.errstate(invalid="ignore"):  # an infinite end times no rows: NaN, no bound there
        return np.minimum(0.0, rows * lo), np.maximum(0.0, rows * hi)


def _pairs_per_group(gid: np.ndarray, key: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray]:
    """(G,) twice: per group, the ordered pairs of its rows with equal ``key``, ``Σ m(m − 1)`` over the keys'
    counts ``m``, and the ordered triples, ``Σ m(m − 1)(m − 2)``."""
    if len(gid) == 0:
        return np.zeros(G), np.zeros(G)
    order = np.lexsort((key, gid))
    g, k = gid[order], key[order]
    start = np.r_[True, (g[1:] != g[:-1]) | (k[1:] != k[:-1])]
    first = np.flatnonzero(start)
    m = np.diff(np.r_[first, len(g)]).astype(np.float64)
    return np.bincount(g[first], m * (m - 1), minlength=G), np.bincount(g[first], m * (m - 1) * (m - 2), minlength=G)


def _least_cut_first(S: list[int], fine: dict, phis: dict) -> list[int]:
    """The predicate columns ``S`` ordered by the rows in the fine bins the box cuts (Bernoulli placement mass
    ``Σ n·φ(1 − φ)``), least first. The fit's base is the first column's prediction (coefficient 1, the others a
    fitted correction): from a column whose bins the box keeps or drops whole, it is each row's exact share of that
    condition. From another column, rare rows the first one's bound drops exactly and the sample never holds came
    back through the collinear terms' correction (nafld2's ``COUNT(*) WHERE value >= 56 AND days < 7187``: 169,801 ±
    1.4 against 169,780, above the count under ``value >= 56`` alone). Among columns that cut alike (none, say),
    the one whose condition keeps or drops the fewest rows on its smaller side comes first: those are the rows
    the sample misses (``v >= 2 AND d < 70.3`` with d's bound between two bins: the 20 rows of a group at v = 1
    came back from d's prediction, 14,153 ± 0.1 against 14,141).

    Examples
    --------
    >>> fine = {0: np.array([[0.0, 50.0, 50.0]]), 1: np.array([[0.0, 30.0, 70.0]])}
    >>> phis = {0: np.array([0.0, 1.0, 0.5]), 1: np.array([0.0, 1.0, 0.0])}   # column 1 keeps or drops bins whole
    >>> _least_cut_first([0, 1], fine, phis)
    [1, 0]
    >>> fine[0] = np.array([[0.0, 2.0, 98.0]])                                 # column 0 drops 2 rows of 100
    >>> phis[0] = np.array([0.0, 0.0, 1.0])
    >>> _least_cut_first([1, 0], fine, phis)
    [0, 1]
    """
    def order(u: int) -> tuple[float, float]:
        kept = fine[u] * phis[u]  # (G, B + 1)
        smaller = np.minimum(kept.sum(axis=1), (fine[u] - kept).sum(axis=1))  # per group, the condition's rarer side
        return float((kept * (1 - phis[u])).sum()), float(smaller.sum())

    return sorted(S, key=order)


def _centre(info: ColumnInfo, fine: np.ndarray, mean: np.ndarray) -> float:
    """The mean of a numeric column's non-NULL values in the table (0 for a column SUM does not apply to, or
    without values), from its fine bins' counts ``fine`` and means ``mean`` (G, B + 1)."""
    n = fine[:, 1:].sum()
    if not info.numeric or not n > 0:
        return 0.0
    return float((fine[:, 1:] * mean[:, 1:]).sum() / n)


def _centred(values: np.ndarray, centre: float) -> np.ndarray:
    """Each value less ``centre``; 0 where NULL (NaN)."""
    return np.where(np.isnan(values), 0.0, values - centre)


def _with_deviations(totals: dict, centre: dict[int, float]) -> dict:
    """A sum grid's totals per cell, with each SUM key's ``("s", j)`` also as the deviations' key ``("d", j)``:
    less ``centre[j]`` times the rows it counts (its column's non-NULL count where it has NULLs, else the
    rows)."""
    out = dict(totals)
    for key, tot in totals.items():
        if key[0] == "s":
            j = key[1]
            out[("d", j)] = tot - centre[j] * totals.get(("nn", j), totals[("n", None)])
    return out


def _shared_messages(memo: dict, tree: _Forest, phis: dict, factors: dict) -> dict:
    """The messages of ``memo`` (computed under the box's own factors ``phis``) that hold under ``factors`` too:
    those whose subtree (the node's side of the edge to its parent) has no column whose factor differs. A key's
    factors differ from the box's in one column at most (:meth:`Synopsis._key_factors`)."""
    changed = {u for u in factors if factors[u] is not phis[u]}
    if not changed:
        return memo
    shared = {}
    for (node, parent), lam in memo.items():
        side, stack = set(), [(node, parent)]
        while stack:
            x, par = stack.pop()
            side.add(x)
            stack += [(v, x) for v in tree.adj[x] if v != par]
        if not side & changed:
            shared[(node, parent)] = lam
    return shared


def _point_bins(info: ColumnInfo, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Per bin, whether its rows all hold one value (a continuous column's bin narrower than a billionth of
    its position): a within-bin position means nothing there."""
    if info.step > 0:
        return np.zeros(len(lower), dtype=bool)
    return (upper - lower) <= 1e-9 * np.maximum(1.0, np.abs(lower))


def _half_open(info: ColumnInfo, lo: float, loi: bool, hi: float, hii: bool) -> tuple[float, float]:
    """The condition as [L, U) on the column's line, where a value v occupies [v, v + step)."""
    s = info.step
    if s > 0:
        if math.isfinite(lo):
            L = math.ceil(lo / s - 1e-9) * s if loi else (math.floor(lo / s + 1e-9) + 1) * s
        else:
            L = -math.inf
        if math.isfinite(hi):
            U = (math.floor(hi / s + 1e-9) + 1) * s if hii else math.ceil(hi / s - 1e-9) * s
        else:
            U = math.inf
        return L, U
    if lo == hi and loi and hii:
        return lo, float(np.nextafter(lo, np.inf))
    return lo, hi


def _intersect(a: list, b: list) -> list:
    out = []
    for lo1, li1, hi1, hi1i in a:
        for lo2, li2, hi2, hi2i in b:
            lo, li = (lo1, li1) if lo1 > lo2 else (lo2, li2) if lo2 > lo1 else (lo1, li1 and li2)
            hi, hii = (hi1, hi1i) if hi1 < hi2 else (hi2, hi2i) if hi2 < hi1 else (hi1, hi1i and hi2i)
            if lo < hi or (lo == hi and li and hii):
                out.append((lo, li, hi, hii))
    return out


def _matches(col: pd.Series, value: object) -> np.ndarray:
    try:
        return (col == value).to_numpy(dtype=bool, na_value=False)
    except (TypeError, ValueError):
        return np.zeros(len(col), dtype=bool)


def interval_variance(residual: np.ndarray, placement: np.ndarray) -> np.ndarray:
    """The variance an interval is built from: the larger of the residuals' (design-based: the sample's
    estimate of the whole error, the cut bins' placement included wherever sample rows fall there) and the
    placement term's (model-based: the error of rows in the fine bins the box cuts, which a sample with few or no
    rows there underestimates). Their sum would count the cut bins' error twice once the sample sees them.

    Examples
    --------
    >>> interval_variance(np.array([4.0, 1.0]), np.array([1.0, 3.0])).tolist()
    [4.0, 3.0]
    """
    return np.maximum(residual, placement)


def z_value(confidence: float) -> float:
    return float(ndtri(0.5 + confidence / 2))


def load(con: Connector, table: str) -> Synopsis:
    """Read the synopsis of ``table`` from the database (raises InputError naming the table when none, or when
    it was written in another format version). The stored tables are read by :func:`densitas.aqp.store.read`;
    this adds what the model derives from them (per pair grid: cell starts and per-dimension row sums)."""
    from densitas.aqp import store

    st = store.read(con, table)
    G = len(st.groups)
    pairs = []
    for p in st.pairs:
        maps = p.maps
        R = (int(maps[0].max()) + 1, int(maps[1].max()) + 1)
        flat = (p.gid * R[0] + p.c[0], p.gid * R[1] + p.c[1])
        rowsum = tuple(np.bincount(flat[d], p.n, minlength=G * R[d]).reshape(G, R[d]) for d in (0, 1))
        pairs.append(Pair(**{**vars(p), "res": (R[0] - 1, R[1] - 1)},
                          starts=(_starts(maps[0]), _starts(maps[1])), rowsum=rowsum, flat=flat))
    return Synopsis(st.meta, st.infos, st.groups, st.marg, st.sums, pairs, st.scores, st.sample_gid, st.sample_vals,
                    (st.outlier_gid, st.outlier_vals))
