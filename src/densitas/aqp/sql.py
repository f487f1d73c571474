"""The SQL the approximate engine answers, parsed with sqlglot into a small :class:`Query`.

Supported: ``COUNT(*)``, ``COUNT(col)``, ``SUM(col)``, ``AVG(col)`` (several per query, optionally aliased) from
one table; ``WHERE`` as a conjunction of ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``, ``=``, ``IN`` between a column
and literals; ``GROUP BY`` columns (which must also be selected or are added); ``ORDER BY`` on output columns.
Anything else raises :class:`~densitas.UnsupportedQueryError` naming the construct.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from densitas.exceptions import InputError, UnsupportedQueryError

__all__ = ["DEFAULT_SCHEMA", "Aggregate", "Condition", "Query", "exact_select", "parse", "read_only_select",
           "resolve_columns", "table_key"]

_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg"}
_CMP = {exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">=", exp.EQ: "="}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}
# statements and clauses that write, change the session or reach outside the database: never inside an exact query
_WRITES = tuple(getattr(exp, name) for name in (
    "Into", "Create", "Drop", "Insert", "Update", "Delete", "Merge", "Alter", "TruncateTable", "Command", "Copy",
    "Pragma", "Set", "Use", "Transaction", "Commit", "Rollback", "Attach", "Detach", "LoadData", "Cache",
    "Uncache", "Refresh", "Install", "Export", "Grant", "Revoke", "Analyze", "Summarize") if hasattr(exp, name))
# functions with side effects (sequence state, the session's random seed)
_WRITING_FUNCTIONS = frozenset({"nextval", "currval", "setseed", "setval"})
# DuckDB's default schema: ``main.t`` is the table ``t``
DEFAULT_SCHEMA = "main"


@dataclass(frozen=True)
class Aggregate:
    func: str  # count | sum | avg
    column: str | None  # None for COUNT(*)
    alias: str


@dataclass(frozen=True)
class Condition:
    """``column op value`` with op in <, <=, >, >=, =; or ``column IN values`` (op "in")."""

    column: str
    op: str
    value: object
    sql: str


@dataclass(frozen=True)
class Query:
    sql: str
    table: str
    aggregates: tuple[Aggregate, ...]
    conditions: tuple[Condition, ...]
    group_by: tuple[str, ...]
    order_by: tuple[tuple[str, bool], ...] = field(default=())  # (output column, descending)

    @property
    def columns(self) -> set[str]:
        cols = {c.column for c in self.conditions} | set(self.group_by)
        return cols | {a.column for a in self.aggregates if a.column is not None}


def _name(col: exp.Column) -> str:
    if col.table and not isinstance(col.this, exp.Identifier):
        raise UnsupportedQueryError(f"column reference {col.sql()!r}")
    return col.name


def named_as(name: str, names: Sequence[str], key: Callable[[str], str] = str.lower) -> list[str]:
    """The ones of ``names`` that ``name`` refers to as DuckDB matches identifiers: ``[name]`` when it is one of
    them, else those equal to it under ``key`` (case folded by default; :func:`table_key` for tables). More than
    one is ambiguous: the callers say so; none, it names nothing.

    Examples
    --------
    >>> named_as("Distance", ["distance", "carrier"]), named_as("x", ["X", "x"]), named_as("X", ["x1", "x2"])
    (['distance'], ['x'], [])
    >>> named_as("a", ["A", "b", "A"]), named_as("main.T", ["t", "u"], key=table_key)
    (['A', 'A'], ['t'])
    """
    if name in names:
        return [name]
    folded = key(name)
    return [n for n in names if key(n) == folded]


def _as_named(name: str, names: Sequence[str]) -> str | None:
    """The one of ``names`` that ``name`` refers to (:func:`named_as`), the first of several; None when none is."""
    return next(iter(named_as(name, names)), None)


def table_key(name: str) -> str:
    """What identifies a table as DuckDB matches names: case folded, the default schema's qualifier dropped.

    Examples
    --------
    >>> table_key("MAIN.Flights"), table_key("flights"), table_key("other.flights")
    ('flights', 'flights', 'other.flights')
    """
    schema, _, tbl = name.lower().rpartition(".")
    return tbl if schema == DEFAULT_SCHEMA else name.lower()


def _check_qualifiers(tree: exp.Select, source: exp.Table) -> None:
    """Every qualified column names the table read (``t.x``, ``main.t.x``) or, when it has one, its alias
    (``a.x``), matched case-insensitively as DuckDB does; anything else names a table the query does not read.
    The qualifiers are then dropped from ``tree``: the exact query (:func:`exact_select`) reads the table unaliased."""
    alias = source.alias
    schema = (source.db or DEFAULT_SCHEMA).lower()
    for col in tree.find_all(exp.Column):
        if not col.table or col.find_ancestor(exp.Select) is not tree:  # a subquery's columns are refused with it
            continue
        if col.catalog:
            raise UnsupportedQueryError(f"column reference {col.sql(dialect='duckdb')!r} qualified by a database")
        if alias:
            ok = col.table.lower() == alias.lower() and not col.db
        else:
            ok = col.table.lower() == source.name.lower() and (not col.db or col.db.lower() == schema)
        if not ok:
            qualifier = ".".join(p for p in (col.db, col.table) if p)
            raise InputError(f"sql: the column {col.sql(dialect='duckdb')!r} refers to the table {qualifier!r}, which "
                             f"the query does not read (FROM {source.sql(dialect='duckdb')}); qualify columns by "
                             f"{alias or source.name!r} or not at all.")
        col.set("table", None)
        col.set("db", None)


def resolve_columns(q: Query, names: Sequence[str]) -> Query:
    """``q`` with its columns (WHERE, aggregates, GROUP BY, ORDER BY) spelled as in ``names``, a synopsis' columns,
    matched as DuckDB matches identifiers, quoted or not: exactly, else case-insensitively (``Distance`` is
    ``distance``). A column that matches several of ``names`` up to case only must be named exactly (an
    :class:`~densitas.InputError`); one that matches none is left as it is (the synopsis names it as missing).
    Aliases are kept: the exact query (:func:`exact_select`) names its outputs so too.

    Examples
    --------
    >>> q = resolve_columns(parse("SELECT Carrier, AVG(Distance) FROM t WHERE DISTANCE < 9 GROUP BY Carrier "
    ...                           "ORDER BY CARRIER"), ["distance", "carrier"])
    >>> q.group_by, q.aggregates[0].column, q.aggregates[0].alias, q.conditions[0].column, q.order_by
    (('carrier',), 'distance', 'avg_Distance', 'distance', (('carrier', False),))
    """
    known = set(names)
    missing = [c for c in q.columns if c not in known]
    if not missing:
        return q
    rename: dict[str, str] = {}
    for c in missing:
        folded = named_as(c, names)
        if len(folded) > 1:
            raise InputError(f"sql: the column {c!r} matches the columns {sorted(folded)} up to case; name it exactly.")
        if folded:
            rename[c] = folded[0]
    if not rename:
        return q
    groups = set(q.group_by)
    return dataclasses.replace(
        q, aggregates=tuple(dataclasses.replace(a, column=rename.get(a.column, a.column)) for a in q.aggregates),
        conditions=tuple(dataclasses.replace(c, column=rename.get(c.column, c.column)) for c in q.conditions),
        group_by=tuple(rename.get(g, g) for g in q.group_by),
        order_by=tuple((rename.get(o, o) if o in groups else o, d) for o, d in q.order_by))


def _literal(node: exp.Expression, where: str) -> object:
    """A Python value from a literal: numbers, strings, DATE/TIMESTAMP '...' casts, negatives, NULL."""
    if isinstance(node, exp.Paren):
        return _literal(node.this, where)
    if isinstance(node, exp.Neg):
        v = _literal(node.this, where)
        if isinstance(v, (int, float)):
            return -v
        raise UnsupportedQueryError(f"expression {node.sql()!r} in {where}")
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            return float(text)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal) and node.this.is_string:
        kind = node.to.this
        text = node.this.this
        try:
            if kind == exp.DataType.Type.DATE:
                return _dt.date.fromisoformat(text)
            if kind in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME):
                return _dt.datetime.fromisoformat(text)
        except ValueError:
            raise InputError(f"{where}: {node.sql()!r} is not a valid {kind.value.lower()}.") from None
    if isinstance(node, (exp.Cast, exp.TryCast)) and isinstance(node.this, exp.Literal):
        return _literal(node.this, where)
    raise UnsupportedQueryError(f"expression {node.sql()!r} in {where} (only literals may be compared with a "
                                "column)")


def _conditions(node: exp.Expression) -> list[Condition]:
    if isinstance(node, exp.Paren):
        return _conditions(node.this)
    if isinstance(node, exp.And):
        return _conditions(node.this) + _conditions(node.expression)
    if isinstance(node, exp.Or):
        raise UnsupportedQueryError(f"OR in WHERE ({node.sql()!r}); only conjunctions (AND) are supported")
    if isinstance(node, exp.Not):
        raise UnsupportedQueryError(f"NOT in WHERE ({node.sql()!r})")
    text = node.sql(dialect="duckdb")
    if isinstance(node, exp.Between):
        if not isinstance(node.this, exp.Column):
            raise UnsupportedQueryError(f"BETWEEN on an expression ({text!r})")
        col = _name(node.this)
        lo = _literal(node.args["low"], "WHERE")
        hi = _literal(node.args["high"], "WHERE")
        return [Condition(col, ">=", lo, text), Condition(col, "<=", hi, text)]
    if isinstance(node, exp.In):
        if not isinstance(node.this, exp.Column):
            raise UnsupportedQueryError(f"IN on an expression ({text!r})")
        if node.args.get("query") is not None:
            raise UnsupportedQueryError(f"IN with a subquery ({text!r})")
        values = tuple(_literal(v, "WHERE") for v in node.expressions)
        return [Condition(_name(node.this), "in", values, text)]
    for kind, op in _CMP.items():
        if isinstance(node, kind):
            left, right = node.this, node.expression
            if isinstance(left, exp.Column) and not isinstance(right, exp.Column):
                return [Condition(_name(left), op, _literal(right, "WHERE"), text)]
            if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
                return [Condition(_name(right), _FLIP[op], _literal(left, "WHERE"), text)]
            raise UnsupportedQueryError(f"comparison {text!r} (one side must be a column, the other a literal)")
    if isinstance(node, exp.NEQ):
        raise UnsupportedQueryError(f"<> / != in WHERE ({text!r})")
    if isinstance(node, exp.Like):
        raise UnsupportedQueryError(f"LIKE in WHERE ({text!r})")
    if isinstance(node, exp.Is):
        raise UnsupportedQueryError(f"IS [NOT] NULL in WHERE ({text!r})")
    raise UnsupportedQueryError(f"predicate {text!r} in WHERE")


def read_only_select(sql: str) -> exp.Select:
    """Parse ``sql`` as exactly one read-only SELECT.

    Parameters
    ----------
    sql : str
        One SELECT statement in DuckDB's dialect (a trailing semicolon is allowed).

    Returns
    -------
    sqlglot.exp.Select
        The parsed statement. Run its ``.sql(dialect="duckdb")``, never ``sql`` itself: what runs is then exactly
        what was checked.

    Raises
    ------
    InputError
        ``sql`` is not a non-empty string or does not parse.
    UnsupportedQueryError
        ``sql`` holds no statement or several, a statement other than SELECT (UNION, DDL, DML, PRAGMA, COPY,
        ...), ``SELECT ... INTO``, a writing statement inside a subquery, or a function with side effects
        (``nextval``, ``setseed``).
    """
    if not isinstance(sql, str) or not sql.strip():
        raise InputError(f"The 'sql' parameter must be a non-empty string. Got {sql!r} instead.")
    try:
        statements = [s for s in sqlglot.parse(sql, dialect="duckdb") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise InputError(f"sql does not parse: {exc}") from None
    if len(statements) != 1:
        raise UnsupportedQueryError(f"{len(statements)} statements (give exactly one SELECT)")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        raise UnsupportedQueryError(f"{tree.key.upper()} statement (only SELECT is run)")
    for node in tree.walk():
        if isinstance(node, _WRITES):
            raise UnsupportedQueryError(f"{node.key.upper()} inside a SELECT (only read-only SELECTs are run)")
        if isinstance(node, exp.Func):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if name in _WRITING_FUNCTIONS:
                raise UnsupportedQueryError(f"the function {name}() changes the database or the session (only "
                                            "read-only SELECTs are run)")
    return tree


def exact_select(q: Query, max_rows: int | None = None) -> exp.Select:
    """The SELECT that answers ``q`` exactly, built with sqlglot: the engine's output names, groups in order.

    Parameters
    ----------
    q : Query
        A parsed query (see :func:`parse`).
    max_rows : int or None
        When given, the statement returns at most ``max_rows + 1`` rows (so that the caller can tell a result of
        more than ``max_rows`` rows).

    Returns
    -------
    sqlglot.exp.Select
        The statement; ``.sql(dialect="duckdb")`` gives its text, every identifier quoted.
    """
    funcs = {"count": exp.Count, "sum": exp.Sum, "avg": exp.Avg}
    items: list[exp.Expression] = [exp.column(g, quoted=True) for g in q.group_by]
    for a in q.aggregates:
        arg = exp.Star() if a.column is None else exp.column(a.column, quoted=True)
        items.append(exp.alias_(funcs[a.func](this=arg), a.alias, quoted=True))
    db, _, name = q.table.rpartition(".")
    stmt = exp.select(*items).from_(exp.table_(name, db=db or None, quoted=True))
    where = list(dict.fromkeys(c.sql for c in q.conditions))
    if where:
        stmt = stmt.where(*(exp.paren(sqlglot.parse_one(w, dialect="duckdb"), copy=False) for w in where))
    if q.group_by:
        stmt = stmt.group_by(*(exp.column(g, quoted=True) for g in q.group_by))
    order = [exp.Ordered(this=exp.column(c, quoted=True), desc=d) for c, d in q.order_by] \
        or [exp.Ordered(this=exp.column(g, quoted=True), desc=False) for g in q.group_by]
    if order:
        stmt = stmt.order_by(*order)
    if max_rows is not None:
        stmt = stmt.limit(max_rows + 1)
    return stmt


def _default_alias(func: str, column: str | None) -> str:
    return func if column is None else f"{func}_{column}"


@functools.lru_cache(maxsize=4096)
def parse(sql: str) -> Query:
    """Parse ``sql`` (DuckDB dialect) into a :class:`Query`, or raise naming what is not supported."""
    if not isinstance(sql, str) or not sql.strip():
        raise InputError(f"sql must be a non-empty string, got {sql!r}.")
    try:
        statements = sqlglot.parse(sql, dialect="duckdb")
    except sqlglot.errors.ParseError as exc:
        raise InputError(f"sql does not parse: {exc}") from None
    statements = [s for s in statements if s is not None]
    if len(statements) != 1:
        raise UnsupportedQueryError(f"{len(statements)} statements (give exactly one SELECT)")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        raise UnsupportedQueryError(f"{tree.key.upper()} statement (only SELECT is supported)")
    for arg, what in (("joins", "JOIN"), ("having", "HAVING"), ("limit", "LIMIT"), ("offset", "OFFSET"),
                      ("distinct", "SELECT DISTINCT"), ("with_", "WITH"), ("with", "WITH"),
                      ("qualify", "QUALIFY"), ("windows", "WINDOW")):
        if tree.args.get(arg):
            raise UnsupportedQueryError(what)
    from_ = tree.args.get("from_") or tree.args.get("from")
    if from_ is None:
        raise UnsupportedQueryError("SELECT without FROM")
    source = from_.this
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise UnsupportedQueryError(f"FROM {source.sql()!r} (only one plain table is supported)")
    if source.args.get("sample") or tree.args.get("sample"):
        raise UnsupportedQueryError("TABLESAMPLE / USING SAMPLE")
    if source.catalog:
        raise UnsupportedQueryError(f"FROM {source.sql(dialect='duckdb')!r}: a table qualified by its database (name "
                                    "it as schema.table or table)")
    table = source.name if not source.db else f"{source.db}.{source.name}"
    _check_qualifiers(tree, source)

    group_by: list[str] = []
    group = tree.args.get("group")
    if group is not None:
        for g in group.expressions:
            if not isinstance(g, exp.Column):
                raise UnsupportedQueryError(f"GROUP BY expression {g.sql()!r} (only columns)")
            group_by.append(_name(g))

    aggregates: list[Aggregate] = []
    selected_groups: list[str] = []
    for item in tree.expressions:
        alias = None
        node = item
        if isinstance(item, exp.Alias):
            alias, node = item.alias, item.this
        if isinstance(node, exp.Column):
            name = _name(node)
            name = _as_named(name, group_by) or name
            if name not in group_by:
                raise UnsupportedQueryError(f"selected column {name!r} that is not in GROUP BY")
            if alias is not None and alias != name:
                raise UnsupportedQueryError(f"an alias on the GROUP BY column {name!r}")
            selected_groups.append(name)
            continue
        if isinstance(node, exp.Star):
            raise UnsupportedQueryError("SELECT * (select aggregates)")
        func = next((f for k, f in _AGGS.items() if type(node) is k), None)
        if func is None:
            what = node.key.upper() if isinstance(node, exp.Func) else f"expression {node.sql()!r}"
            raise UnsupportedQueryError(f"{what} in SELECT (supported: COUNT(*), COUNT(col), SUM(col), AVG(col))")
        arg = node.this
        if isinstance(arg, exp.Distinct):
            raise UnsupportedQueryError(f"{func.upper()}(DISTINCT ...)")
        if isinstance(arg, exp.Star) and func == "count":
            column = None
        elif isinstance(arg, exp.Column):
            column = _name(arg)
        else:
            raise UnsupportedQueryError(f"{func.upper()} of the expression {arg.sql()!r} (only of a column)")
        aggregates.append(Aggregate(func, column, alias or _default_alias(func, column)))
    if not aggregates:
        raise UnsupportedQueryError("a SELECT without aggregates (approximate answers are COUNT, SUM and AVG)")
    names = [a.alias for a in aggregates] + list(group_by)
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InputError(f"sql: output column {sorted(dup)[0]!r} appears twice; give the aggregates aliases.")

    where = tree.args.get("where")
    conditions = _conditions(where.this) if where is not None else []
    for c in conditions:
        if c.value is None or (c.op == "in" and any(v is None for v in c.value)):
            # x = NULL, x < NULL are never true in SQL: refuse rather than silently answer 0
            raise UnsupportedQueryError(f"comparison with NULL ({c.sql!r}) is never true; use IS NULL semantics "
                                        "explicitly in the database")
        if isinstance(c.value, float) and not math.isfinite(c.value):
            raise InputError(f"WHERE {c.sql!r}: the literal {c.value!r} is not finite.")

    order: list[tuple[str, bool]] = []
    order_node = tree.args.get("order")
    if order_node is not None:
        for o in order_node.expressions:
            target = o.this
            name = _name(target) if isinstance(target, exp.Column) else None
            # an output column, named exactly or up to case (as DuckDB matches it)
            out = None if name is None else _as_named(name, names)
            if out is None:
                raise UnsupportedQueryError(f"ORDER BY {target.sql()!r} (only output columns)")
            order.append((out, bool(o.args.get("desc"))))
    return Query(sql=sql, table=table, aggregates=tuple(aggregates), conditions=tuple(conditions),
                 group_by=tuple(group_by), order_by=tuple(order))
