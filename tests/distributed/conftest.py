"""A two-process ``distributed.LocalCluster`` (one thread each), started once for the whole directory, and the
schedulers the tests run on: that cluster, and Dask's default local scheduler (no client)."""

from __future__ import annotations

import contextlib

import pytest

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="session")
def local_cluster():
    """Two worker processes, one thread each (the workers inherit TRITON_INTERPRET=1 from the test process)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  silence_logs=50) as cluster:
        yield cluster


@pytest.fixture(params=["cluster", "local"])
def scheduler(request, local_cluster):
    """Run a test on the two-worker cluster (a client made current) and on the default local scheduler."""
    if request.param == "cluster":
        with distributed.Client(local_cluster, set_as_default=True) as client:
            yield client
    else:
        with contextlib.nullcontext():
            yield None


@pytest.fixture
def client(local_cluster):
    """The two-worker cluster only."""
    with distributed.Client(local_cluster, set_as_default=True) as c:
        yield c
