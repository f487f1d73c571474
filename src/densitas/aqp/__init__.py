"""Approximate COUNT / SUM / AVG over a database from synopses, with confidence intervals.

``Engine(database).build(table)`` stores a synopsis in the database's ``densitas`` schema;
``Engine.query(sql)`` answers from it. See :mod:`densitas.aqp.synopsis` for the estimators and
:mod:`densitas.aqp.build` for what a synopsis holds.
"""

from __future__ import annotations

from densitas.aqp.connector import Connector, DuckDBConnector
from densitas.aqp.engine import Engine
from densitas.aqp.sql import parse
from densitas.exceptions import (
    DatabaseError,
    NoSynopsisError,
    ResultTooLargeError,
    StaleSynopsisError,
    UnsupportedQueryError,
)

__all__ = ["Connector", "DatabaseError", "DuckDBConnector", "Engine", "NoSynopsisError", "ResultTooLargeError",
           "StaleSynopsisError", "UnsupportedQueryError", "parse"]
