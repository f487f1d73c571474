"""Errors of the approximate engine: every failure a user can cause is a DensitasError of the right type."""

from __future__ import annotations

import pytest

from densitas.aqp import build as build_mod
from densitas.exceptions import DensitasError, InputError


@pytest.mark.parametrize("value", [32768, 40000, 65536, 1, True, 2.5])
def test_max_bins_outside_the_stored_range_is_refused(mem_engine, value):
    """Bin numbers are stored as SMALLINT: a larger max_bins is refused before any work, not overflowed."""
    mem_engine.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(50000) r(i)")
    with pytest.raises(InputError):
        mem_engine.build("t", max_bins=value, budget_bytes=20_000_000)


def test_max_bins_at_the_limit_builds(mem_engine):
    mem_engine.con.execute("CREATE TABLE t AS SELECT i::DOUBLE AS x FROM range(40000) r(i)")
    meta = mem_engine.build("t", max_bins=build_mod.INDEX_MAX, budget_bytes=20_000_000)
    assert meta["rows"] == 40000


@pytest.mark.parametrize("value", [32768, 50000, 0])
def test_max_groups_outside_the_stored_range_is_refused(mem_engine, value):
    """Group ids are stored as SMALLINT too."""
    mem_engine.con.execute("CREATE TABLE g AS SELECT i::DOUBLE AS x, (i % 40000)::VARCHAR AS k "
                           "FROM range(80000) r(i)")
    with pytest.raises(InputError):
        mem_engine.build("g", group_by=["k"], max_groups=value, budget_bytes=2_000_000)


def test_build_option_errors_are_densitas_errors():
    with pytest.raises(DensitasError):
        build_mod.BuildOptions(max_bins=10**6).check()
