"""The stored format of a synopsis: schema, format version, the tables a synopsis is written to, reading them back.

Every synopsis lives in the ``densitas`` schema of the database it describes:

* the catalog ``densitas.synopses``: one row per table with a synopsis (its id, format version, row count,
  data fingerprint, columns and their kinds as JSON, the pair grids chosen, the options, the KDE bandwidths,
  its size);
* seven tables per synopsis, named ``<kind>_<id>``, each described once below by a :class:`TableLayout` (column
  names and SQL types). The layouts create the tables and give their nominal size (rows times the widths of
  the column types: :func:`stored_bytes`); the build counts the sample's and grids' rows against its byte
  budget at their compact cost instead (``densitas.aqp.build.RowCosts``), as DuckDB stores them compressed.

=========  ========================================================================================
kind       rows
=========  ========================================================================================
``marg``   per column, group and fine bin (0 = NULL): exact row count ``n`` and sum ``s``
``sums``   per column, group and cell of the column's sum grid: the row count ``n``, every numeric
           column's sum ``s<k>`` and (nullable columns) non-NULL count ``nn<k>``
``pairs``  per stored pair grid, group and non-empty cell ``(c0, c1)``: the row count ``n``
``sample`` the stratified sample: group id and each column's value ``v<j>`` on its numeric line
``outliers`` the rows set aside whole (a value far out in a heavy tail), as the sample stores its rows; the
           other tables describe the rest of the table
``edges``  per column and bin: lower edge ``lo``, the smallest/largest value the bin holds and the rows at each
``groups`` per group id: the GROUP BY values and the group's row count ``n``
=========  ========================================================================================

A reader checks the catalog's ``version`` against :data:`FORMAT_VERSION`; a synopsis written in another format is
refused with an :class:`~densitas.InputError` asking for a rebuild.

Examples
--------
>>> marg = marg_layout()
>>> [c.name for c in marg.columns], marg.row_bytes
(['col', 'gid', 'bin', 'n', 's'], 18)
>>> marg.name("0123abcd")
'marg_0123abcd'
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from densitas.aqp.columns import ColumnInfo
from densitas.aqp.connector import Connector
from densitas.exceptions import InputError

__all__ = ["CATALOG", "FORMAT_VERSION", "INDEX_MAX", "KINDS", "SCHEMA", "StoredColumn", "StoredPair", "StoredSynopsis",
           "SynopsisTables", "TableLayout", "catalog_ids", "cell_map", "count_rows", "drop_synopsis",
           "edges_layout", "ensure_schema", "groups_layout", "marg_layout", "pairs_layout", "read", "sample_layout",
           "stored_bytes", "sums_layout", "table", "write_catalog"]

SCHEMA = "densitas"
#: Version of the stored format; a synopsis of another version must be rebuilt. 3: each bin's occupied range
#: (``edges.vmin``/``vmax``); 4: the rows at its ends (``edges.nmin``/``nmax``); 5: the ``outliers`` table.
FORMAT_VERSION = 5
KINDS = ("marg", "sums", "pairs", "sample", "outliers", "edges", "groups")
#: bin, cell and group numbers are stored as SMALLINT: the build keeps them within this bound
INDEX_MAX = 32767
#: bytes per value of each SQL type, for the synopsis' size (other types, VARCHAR included, count 8)
WIDTHS = {"BIGINT": 8, "DOUBLE": 8, "INTEGER": 4, "SMALLINT": 2}


@dataclass(frozen=True)
class StoredColumn:
    """A column of a stored table: its name and SQL type.

    Examples
    --------
    >>> StoredColumn("n", "INTEGER").width
    4
    >>> StoredColumn("g", "VARCHAR").width
    8
    """

    name: str
    sql_type: str

    @property
    def width(self) -> int:
        """Bytes one value counts for in the synopsis' size."""
        return WIDTHS.get(self.sql_type, 8)

    def definition(self) -> exp.ColumnDef:
        """The column's definition in a CREATE TABLE statement."""
        return exp.ColumnDef(this=exp.to_identifier(self.name, quoted=True),
                             kind=exp.DataType.build(self.sql_type, dialect="duckdb"))


def _columns(*spec: str) -> tuple[StoredColumn, ...]:
    """``"name TYPE"`` strings -> stored columns."""
    return tuple(StoredColumn(*s.split(" ", 1)) for s in spec)


def table(name: str) -> exp.Table:
    """The quoted table ``densitas.<name>``.

    Examples
    --------
    >>> table("synopses").sql("duckdb")
    '"densitas"."synopses"'
    """
    return exp.table_(name, db=SCHEMA, quoted=True)


@dataclass(frozen=True)
class TableLayout:
    """The columns of one stored table kind (for one synopsis: some kinds have a column per synopsis column).

    Examples
    --------
    >>> lay = pairs_layout()
    >>> lay.create("abc").sql("duckdb")
    'CREATE TABLE "densitas"."pairs_abc" ("pair" SMALLINT, "gid" SMALLINT, "c0" SMALLINT, "c1" SMALLINT, "n" INT)'
    """

    kind: str
    columns: tuple[StoredColumn, ...]

    @property
    def row_bytes(self) -> int:
        """Bytes one row counts for in the synopsis' size."""
        return sum(c.width for c in self.columns)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def name(self, synopsis_id: str) -> str:
        """The table's name (without the schema) for the synopsis ``synopsis_id``."""
        return f"{self.kind}_{synopsis_id}"

    def table(self, synopsis_id: str) -> exp.Table:
        """The quoted table ``densitas.<kind>_<id>``."""
        return table(self.name(synopsis_id))

    def create(self, synopsis_id: str) -> exp.Create:
        """``CREATE TABLE`` of this layout for the synopsis ``synopsis_id``."""
        return exp.Create(this=exp.Schema(this=self.table(synopsis_id),
                                          expressions=[c.definition() for c in self.columns]), kind="TABLE")


def marg_layout() -> TableLayout:
    """Fine 1-D histograms: ``(col, gid, bin)`` -> row count ``n``, sum ``s``."""
    return TableLayout("marg", _columns("col SMALLINT", "gid SMALLINT", "bin SMALLINT", "n INTEGER", "s DOUBLE"))


def sums_layout(numeric: Sequence[int], nullable: Sequence[int]) -> TableLayout:
    """Sum grids: ``(col, gid, cell)`` -> row count ``n``, sums ``s<k>`` of the numeric columns, non-NULL counts
    ``nn<k>`` of the nullable numeric ones.

    Examples
    --------
    >>> sums_layout([0, 2], [2]).names
    ['col', 'gid', 'cell', 'n', 's0', 's2', 'nn2']
    """
    return TableLayout("sums", _columns("col SMALLINT", "gid SMALLINT", "cell SMALLINT", "n INTEGER")
                       + tuple(StoredColumn(f"s{k}", "DOUBLE") for k in numeric)
                       + tuple(StoredColumn(f"nn{k}", "INTEGER") for k in nullable))


def pairs_layout() -> TableLayout:
    """Pair grids, sparse: ``(pair, gid, c0, c1)`` -> row count ``n`` of each non-empty cell."""
    return TableLayout("pairs", _columns("pair SMALLINT", "gid SMALLINT", "c0 SMALLINT", "c1 SMALLINT", "n INTEGER"))


def sample_layout(n_columns: int, kind: str = "sample", integers: Sequence[bool] | None = None) -> TableLayout:
    """The sample: group id and each column's value ``v<j>`` on its numeric line (NULL where NULL); the outliers
    (``kind="outliers"``) alike. ``integers[j]``: column ``j`` holds integers only (a date's days, an integer, a
    value's code: ``densitas.aqp.build.integer_columns``), stored as BIGINT, which DuckDB bit-packs to the bits
    of each vector's range; as a DOUBLE, its ALP chose 25.9 bits a value for integers of a 12-bit range in one row
    order of a generated table, and 12.2 in another.

    Examples
    --------
    >>> [c.sql_type for c in sample_layout(2, integers=[True, False]).columns]
    ['SMALLINT', 'BIGINT', 'DOUBLE']
    """
    ints = list(integers) if integers is not None else [False] * n_columns
    return TableLayout(kind, (StoredColumn("gid", "SMALLINT"),
                              *(StoredColumn(f"v{j}", "BIGINT" if ints[j] else "DOUBLE") for j in range(n_columns))))


def edges_layout() -> TableLayout:
    """Bins: ``(col, bin)`` -> lower edge ``lo``, smallest and largest value in the bin (NULL when empty) and
    the table's rows at each (``nmin``, ``nmax``)."""
    return TableLayout("edges", _columns("col INTEGER", "bin INTEGER", "lo DOUBLE", "vmin DOUBLE", "vmax DOUBLE",
                                         "nmin BIGINT", "nmax BIGINT"))


def groups_layout(group_columns: Sequence[tuple[str, str]]) -> TableLayout:
    """Groups: ``gid`` -> the GROUP BY values (their types in the table) and the row count ``n``.

    ``gid`` is BIGINT (a row number) when there are GROUP BY columns and INTEGER (the constant 0) without, as
    format 3 has always stored it.
    """
    gid = StoredColumn("gid", "BIGINT" if group_columns else "INTEGER")
    return TableLayout("groups", (gid, *(StoredColumn(n, t) for n, t in group_columns), StoredColumn("n", "BIGINT")))


@dataclass(frozen=True)
class SynopsisTables:
    """The layouts of one synopsis' tables, and its id."""

    id: str
    marg: TableLayout
    sums: TableLayout
    pairs: TableLayout
    sample: TableLayout
    outliers: TableLayout
    edges: TableLayout
    groups: TableLayout

    @classmethod
    def of(cls, synopsis_id: str, infos: Sequence[ColumnInfo], group_columns: Sequence[tuple[str, str]]
           ) -> SynopsisTables:
        """The layouts of a synopsis over ``infos`` (their ``nullable`` known) grouped by ``group_columns``."""
        numeric = [j for j, info in enumerate(infos) if info.numeric]
        nullable = [j for j in numeric if infos[j].nullable]
        return cls(synopsis_id, marg_layout(), sums_layout(numeric, nullable), pairs_layout(),
                   sample_layout(len(infos)), sample_layout(len(infos), "outliers"), edges_layout(),
                   groups_layout(group_columns))

    def table(self, kind: str) -> exp.Table:
        """The quoted table of ``kind`` (one of :data:`KINDS`)."""
        return getattr(self, kind).table(self.id)


def count_rows(con: Connector, tbl: exp.Table) -> int:
    """Rows of ``tbl``."""
    return int(con.fetch_rows(sqlglot.select(exp.Count(this=exp.Star())).from_(tbl))[0][0])


def stored_bytes(con: Connector, tables: SynopsisTables, *kinds: str) -> int:
    """Bytes of the synopsis' tables of ``kinds``: their rows times their layouts' row widths."""
    return sum(count_rows(con, tables.table(k)) * getattr(tables, k).row_bytes for k in kinds)


# ---- the catalog ----------------------------------------------------------------------------------------------

#: The catalog ``densitas.synopses``: one row per synopsis (the first column is its key).
CATALOG = _columns("table_name VARCHAR", "id VARCHAR", "version INTEGER", "created_at TIMESTAMP",
                   "build_seconds DOUBLE", "rows BIGINT", "fingerprint VARCHAR", "columns VARCHAR",
                   "group_by VARCHAR", "grids VARCHAR", "options VARCHAR", "bandwidths VARCHAR",
                   "size_bytes BIGINT", "table_bytes BIGINT")


def _catalog() -> exp.Table:
    return table("synopses")


def _where_table(name: str) -> exp.Expression:
    return exp.column("table_name", quoted=True).eq(exp.Placeholder())


def ensure_schema(con: Connector) -> None:
    """Create the ``densitas`` schema and the catalog where they do not exist."""
    con.execute(exp.Create(this=exp.to_identifier(SCHEMA, quoted=True), kind="SCHEMA", exists=True))
    defs = [c.definition() for c in CATALOG]
    defs[0].set("constraints", [exp.ColumnConstraint(kind=exp.PrimaryKeyColumnConstraint())])
    con.execute(exp.Create(this=exp.Schema(this=_catalog(), expressions=defs), kind="TABLE", exists=True))


def catalog_ids(con: Connector, table_name: str) -> list[str]:
    """Ids of the synopses the catalog holds for ``table_name`` (none or one)."""
    q = sqlglot.select(exp.column("id", quoted=True)).from_(_catalog()).where(_where_table(table_name))
    return [r[0] for r in con.fetch_rows(q, [table_name])]


def write_catalog(con: Connector, meta: dict) -> None:
    """Replace the catalog row of ``meta['table_name']`` by ``meta`` (``created_at``: now)."""
    con.execute(exp.delete(_catalog(), where=_where_table(meta["table_name"])), [meta["table_name"]])
    keys = list(meta)
    cols = [exp.column(k, quoted=True) for k in (*keys, "created_at")]
    values = exp.values([exp.Tuple(expressions=[exp.Placeholder() for _ in keys] + [exp.CurrentTimestamp()])])
    con.execute(exp.Insert(this=exp.Schema(this=_catalog(), expressions=cols), expression=values),
                [meta[k] for k in keys])


def set_build_seconds(con: Connector, table_name: str, seconds: float) -> None:
    """Record the build time of ``table_name``'s synopsis."""
    con.execute(exp.update(_catalog(), {"build_seconds": exp.Placeholder()}, where=_where_table(table_name)),
                [seconds, table_name])


def drop_synopsis(con: Connector, synopsis_id: str) -> None:
    """Drop the tables of the synopsis ``synopsis_id`` (and the ``cells`` table of format 1)."""
    for kind in (*KINDS, "cells"):
        con.execute(exp.Drop(tables=[table(f"{kind}_{synopsis_id}")], kind="TABLE", exists=True))


# ---- reading a synopsis back ----------------------------------------------------------------------------------


def cell_map(res: int, bins: int) -> np.ndarray:
    """Fine bin (0 = NULL, 1..bins) -> cell (0 = NULL, 1..res) of a grid dimension of resolution ``res``.

    Maps of powers of two nest, so a finer grid coarsens to a coarser one by summing.

    Examples
    --------
    >>> cell_map(2, 4).tolist()
    [0, 1, 1, 2, 2]
    >>> cell_map(8, 4).tolist()
    [0, 1, 2, 3, 4]
    """
    fine = np.arange(bins + 1)
    if res >= bins:
        return fine
    return np.where(fine == 0, 0, 1 + (fine - 1) * res // bins)


@dataclass
class StoredPair:
    """A stored pair grid as read: columns, stored resolution, dependence score, its sparse cells
    ``(gid, (c0, c1), n)`` and, per dimension, the map fine bin -> cell."""

    cols: tuple[int, int]
    res: tuple[int, int]
    score: float
    gid: np.ndarray
    c: tuple[np.ndarray, np.ndarray]
    n: np.ndarray
    maps: tuple[np.ndarray, np.ndarray]


@dataclass
class StoredSynopsis:
    """A synopsis' tables as read from the database, in arrays (see :func:`read`).

    ``marg[j]``: ``(counts, sums)`` per fine bin, each ``(G, B_j + 1)``; ``sums[j]``: ``(map, totals)`` with the
    map fine bin -> cell of column ``j``'s sum grid and ``totals[key]`` a ``(G, cells + 1)`` array for the keys
    ``("n", None)``, ``("s", k)`` and ``("nn", k)``; ``sample_vals``: ``(rows, columns)``, NaN where NULL;
    ``outlier_gid`` and ``outlier_vals`` the rows set aside whole, alike.
    """

    meta: dict
    infos: list[ColumnInfo]
    groups: pd.DataFrame
    marg: dict[int, tuple[np.ndarray, np.ndarray]]
    sums: dict[int, tuple[np.ndarray, dict]]
    pairs: list[StoredPair]
    scores: dict[tuple[int, int], float]
    sample_gid: np.ndarray
    sample_vals: np.ndarray
    outlier_gid: np.ndarray
    outlier_vals: np.ndarray


def _array(d: dict, c: str, dtype=np.float64) -> np.ndarray:
    """Column ``c`` of a fetched result as ``dtype``, NULL and NaN as 0."""
    a = d[c]
    if np.ma.isMaskedArray(a):
        return np.nan_to_num(np.ma.filled(np.ma.asarray(a).astype(dtype), 0))
    return np.nan_to_num(np.asarray(a, dtype=dtype))


def _select(tbl: exp.Table, columns: Sequence[str] | None = None, order: Sequence[str] = ()) -> exp.Select:
    cols = [exp.Star()] if columns is None else [exp.column(c, quoted=True) for c in columns]
    q = sqlglot.select(*cols).from_(tbl)
    return q.order_by(*(exp.column(c, quoted=True) for c in order)) if order else q


def read(con: Connector, table_name: str) -> StoredSynopsis:
    """Read the synopsis of ``table_name`` from the database.

    Raises
    ------
    InputError
        When the table has no synopsis, or its synopsis was written in another format version (rebuild it).

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp import Engine
    >>> eng = Engine(duckdb.connect())
    >>> eng.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(1000) r(i)")
    >>> _ = eng.build("t")
    >>> st = read(eng.con, "t")
    >>> st.meta["rows"], st.infos[0].name, float(st.marg[0][0].sum())
    (1000, 'x', 1000.0)
    """
    try:
        rows = con.fetch_df(_select(_catalog()).where(_where_table(table_name)), [table_name])
    except Exception:
        rows = pd.DataFrame()
    if rows.empty:
        raise InputError(f"table {table_name!r} has no synopsis; build one first (densitas build / Engine.build).")
    meta = rows.iloc[0].to_dict()
    if int(meta.get("version") or 0) != FORMAT_VERSION:
        raise InputError(f"the synopsis of {table_name!r} has format version {meta.get('version')!r}, this densitas "
                         f"reads version {FORMAT_VERSION}; rebuild it (densitas build / Engine.build).")
    sid = meta["id"]
    col_dicts = json.loads(meta["columns"])
    edge_cols = ("lo", "vmin", "vmax", "nmin", "nmax")
    edges = con.fetch_df(_select(table(f"edges_{sid}"), ["col", "bin", *edge_cols], ["col", "bin"]))
    infos = []
    for j, d in enumerate(col_dicts):
        e = edges.loc[edges["col"] == j]
        infos.append(ColumnInfo.from_dict(d, *(e[c].to_numpy(dtype=np.float64, na_value=np.nan)
                                               for c in edge_cols)))
    if len(infos) == 0:
        raise InputError(f"synopsis of {table_name!r} has no columns")
    groups = con.fetch_df(_select(table(f"groups_{sid}"), order=["gid"])).drop(columns="gid")
    G = len(groups)
    grids = json.loads(meta["grids"])

    m = con.fetch_numpy(_select(table(f"marg_{sid}"), ["col", "gid", "bin", "n", "s"]))
    mcol, mg, mb = (_array(m, c, np.int64) for c in ("col", "gid", "bin"))
    mn, ms = _array(m, "n"), _array(m, "s")
    marg = {}
    for j, info in enumerate(infos):
        sel = mcol == j
        w = np.zeros((G, info.bins + 1))
        sm = np.zeros((G, info.bins + 1))
        np.add.at(w, (mg[sel], mb[sel]), mn[sel])
        np.add.at(sm, (mg[sel], mb[sel]), ms[sel])
        marg[j] = (w, sm)

    sm_ = con.fetch_numpy(_select(table(f"sums_{sid}")))
    scol, sg, sc = (_array(sm_, c, np.int64) for c in ("col", "gid", "cell"))
    value_names = [c for c in sm_ if c not in ("col", "gid", "cell")]
    values = {c: _array(sm_, c) for c in value_names}
    sums = {}
    for j, info in enumerate(infos):
        cmap = cell_map(grids["sum_res"][j], info.bins)
        sel = scol == j
        tot = {}
        for c in value_names:
            key = ("n", None) if c == "n" else (("nn", int(c[2:])) if c.startswith("nn") else ("s", int(c[1:])))
            a = np.zeros((G, int(cmap.max()) + 1))
            np.add.at(a, (sg[sel], sc[sel]), values[c][sel])
            tot[key] = a
        for k, info_k in enumerate(infos):  # non-nullable columns: the non-NULL count is the row count
            if info_k.numeric and ("nn", k) not in tot:
                tot[("nn", k)] = tot[("n", None)]
        sums[j] = (cmap, tot)

    pr = con.fetch_numpy(_select(table(f"pairs_{sid}"), ["pair", "gid", "c0", "c1", "n"]))
    pid = _array(pr, "pair", np.int64)
    pairs = []
    for g in grids["pairs"]:
        sel = pid == g["id"]
        a, b = g["cols"]
        ra, rb = g["res"]
        pairs.append(StoredPair((a, b), (ra, rb), float(g["score"]), _array(pr, "gid", np.int64)[sel],
                                (_array(pr, "c0", np.int64)[sel], _array(pr, "c1", np.int64)[sel]),
                                _array(pr, "n")[sel], (cell_map(ra, infos[a].bins), cell_map(rb, infos[b].bins))))
    scores = {(int(a), int(b)): float(v) for a, b, v in grids["scores"]}

    s_gid, s_vals = _rows(con, table(f"sample_{sid}"), len(infos))
    s_vals = decode_sample(s_vals, json.loads(meta.get("options") or "{}").get("sample_decimals"))
    o_gid, o_vals = _rows(con, table(f"outliers_{sid}"), len(infos))
    return StoredSynopsis(meta, infos, groups, marg, sums, pairs, scores, s_gid, s_vals, o_gid, o_vals)


def decode_sample(vals: np.ndarray, decimals: list | None) -> np.ndarray:
    """The sample's values ``(rows, columns)`` from their stored form: a column stored as integer codes at
    ``decimals[j]`` decimal places (:func:`densitas.aqp.build.sample_value`) divided back to its line.

    Examples
    --------
    >>> decode_sample(np.array([[123456.0, 7.0], [np.nan, 8.0]]), [4, None]).tolist()
    [[12.3456, 7.0], [nan, 8.0]]
    """
    if not decimals:
        return vals
    out = np.array(vals, dtype=np.float64, copy=True)
    for j, d in enumerate(decimals):
        if d is not None:
            out[:, j] = out[:, j] / 10.0 ** d if d >= 0 else out[:, j] * 10.0 ** -d
    return out


def _rows(con: Connector, tbl: exp.Table, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A table of the sample's layout: its group ids ``(rows,)`` and values ``(rows, k)``, NaN where NULL."""
    got = con.fetch_numpy(_select(tbl))
    cols_v = []
    for j in range(k):
        a = got[f"v{j}"]
        cols_v.append(np.ma.filled(a.astype(np.float64), np.nan) if np.ma.isMaskedArray(a)
                      else np.asarray(a, dtype=np.float64))
    gid = np.asarray(got["gid"], dtype=np.int64)
    return gid, (np.stack(cols_v, axis=1) if cols_v else np.zeros((len(gid), 0)))
