"""The BLAS thread policy of a query (densitas.aqp.threads)."""

from __future__ import annotations

import threading

import pytest
from threadpoolctl import ThreadpoolController

from densitas import _blas
from densitas.aqp.threads import query_blas_threads
from densitas.exceptions import InputError


def _blas_threads() -> list[int]:
    return [lib.get_num_threads() for lib in ThreadpoolController().select(user_api="blas").lib_controllers]


@pytest.fixture
def two_blas_threads():
    """BLAS set to two threads for the test (one-thread builds stay at one: the policy only lowers it)."""
    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    saved = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(2)
    yield
    for lib, n in zip(libs, saved, strict=True):
        lib.set_num_threads(n)


def test_one_blas_thread_inside_and_the_count_restored(two_blas_threads, monkeypatch):
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    before = _blas_threads()
    assert before and all(n == 2 for n in before)
    with query_blas_threads():
        assert all(n == 1 for n in _blas_threads())
        with query_blas_threads():  # nested: the outer block restores
            assert all(n == 1 for n in _blas_threads())
        assert all(n == 1 for n in _blas_threads())
    assert _blas_threads() == before


def test_other_threads_leave_the_setting_alone(two_blas_threads, monkeypatch):
    """OpenBLAS ignores a count set outside the main thread: a block there changes nothing, and a main-thread
    block open meanwhile keeps its one thread until it leaves."""
    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    seen = []

    def other():
        with query_blas_threads():
            seen.append(_blas_threads())

    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert all(n == 2 for n in seen[0])
    with query_blas_threads():
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert all(n == 1 for n in _blas_threads())
    assert all(n == 2 for n in _blas_threads())
    assert _blas._BLAS.depth == 0


def test_environment_override(two_blas_threads, monkeypatch):
    monkeypatch.setenv("DENSITAS_THREADS", "torch")  # the library's own setting
    with query_blas_threads():
        assert all(n == 2 for n in _blas_threads())
    monkeypatch.setenv("DENSITAS_THREADS", "3")
    with query_blas_threads():
        assert all(n == 3 for n in _blas_threads())
    assert all(n == 2 for n in _blas_threads())
    monkeypatch.setenv("DENSITAS_THREADS", "many")
    with pytest.raises(InputError, match="DENSITAS_THREADS"), query_blas_threads():
        pass


def test_engine_query_runs_with_one_blas_thread(two_blas_threads, monkeypatch, mem_engine):
    from densitas.aqp import synopsis

    monkeypatch.delenv("DENSITAS_THREADS", raising=False)
    mem_engine.con.execute("CREATE TABLE t AS SELECT (i % 97)::DOUBLE AS x FROM range(5000) r(i)")
    mem_engine.build("t")
    seen = []
    original = synopsis.Synopsis.estimate

    def spy(self, *a, **kw):
        seen.append(_blas_threads())
        return original(self, *a, **kw)

    monkeypatch.setattr(synopsis.Synopsis, "estimate", spy)
    mem_engine.query("SELECT COUNT(*) FROM t WHERE x < 40")
    assert seen and all(n == 1 for n in seen[0])
    assert all(n == 2 for n in _blas_threads())
