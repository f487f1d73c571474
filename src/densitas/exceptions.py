"""One exception hierarchy for densitas.

Every error densitas raises on purpose derives from :class:`DensitasError`; each subclass also derives from
the builtin a Python user would catch for that situation, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

__all__ = [
    "DatabaseError",
    "DensitasError",
    "DeviceError",
    "InputError",
    "NoSynopsisError",
    "NotFittedError",
    "ResultTooLargeError",
    "StaleSynopsisError",
    "UnsupportedQueryError",
]


class DensitasError(Exception):
    """Base class of every error raised by densitas."""


class InputError(DensitasError, ValueError):
    """An argument has a bad value, shape or dtype. The message names the argument and the value."""


class DeviceError(DensitasError, RuntimeError):
    """A requested device or backend cannot be used (no CUDA device, Triton missing, ...)."""


class NotFittedError(DensitasError, AttributeError):
    """An estimator was used before ``fit``."""


class UnsupportedQueryError(DensitasError, NotImplementedError):
    """A SQL construct the approximate engine cannot answer; the message names the construct."""


class StaleSynopsisError(DensitasError, RuntimeError):
    """A synopsis no longer matches its table (rows or content changed since it was built)."""


class NoSynopsisError(DensitasError, LookupError):
    """A table has no synopsis (or the database holds no synopses at all); build one first.

    Examples
    --------
    >>> import duckdb
    >>> from densitas.aqp import Engine
    >>> con = duckdb.connect(); _ = con.execute("CREATE TABLE t AS SELECT range AS x FROM range(10)")
    >>> try:
    ...     Engine(con).query("SELECT COUNT(*) FROM t")
    ... except NoSynopsisError:
    ...     print("no synopsis")
    no synopsis
    """


class DatabaseError(DensitasError, RuntimeError):
    """The database failed to run a statement (locked file, I/O error, read-only database, ...); the message
    carries the database's own one-line reason."""


class ResultTooLargeError(DensitasError, RuntimeError):
    """An exact answer has more rows than the caller allowed (``max_rows``)."""
