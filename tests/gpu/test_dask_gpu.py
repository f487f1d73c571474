"""kNN, fuzzy k-means and bandwidth selection on Dask with one worker per GPU (run on the device machine with
-m gpu; needs dask and distributed): blocks made on the workers as CUDA tensors, answers equal to the
single-machine path on one GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")


def _block(seed: int, rows: int, d: int) -> torch.Tensor:
    """A block made on the worker's GPU (rows 0-9 of every block repeat: ties across blocks)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, d, generator=g, device="cuda")
    x[:10] = torch.randn(10, d, generator=torch.Generator(device="cuda").manual_seed(0), device="cuda")
    return x


@pytest.fixture(scope="module")
def gpu_client():
    """One Nanny per GPU (at most 2), each seeing only its GPU through CUDA_VISIBLE_DEVICES."""
    gpus = list(range(min(2, torch.cuda.device_count())))
    workers = {f"gpu{g}": {"cls": distributed.Nanny,
                           "options": {"nthreads": 1, "memory_limit": 0, "env": {"CUDA_VISIBLE_DEVICES": str(g)}}}
               for g in gpus}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": ":0"}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=50) as cluster, \
            distributed.Client(cluster) as client:
        client.wait_for_workers(len(gpus))
        from densitas._dask import register_torch_sizeof

        client.run(register_torch_sizeof)
        yield client


def _sharded(client, sizes: list[int], d: int):
    workers = sorted(client.scheduler_info()["workers"])
    futures = [client.submit(_block, 10 + i, rows, d, workers=[workers[i % len(workers)]], pure=False)
               for i, rows in enumerate(sizes)]
    arr = da.concatenate([da.from_delayed(f, (rows, d), np.float32, meta=np.empty((0, d), np.float32))
                          for f, rows in zip(futures, sizes, strict=True)])
    local = torch.cat([_block(10 + i, rows, d) for i, rows in enumerate(sizes)])
    return arr, local, futures


def test_kneighbors_sharded_on_gpus_equals_one_gpu(gpu_client):
    from densitas.neighbors import kneighbors

    X, local, _keep = _sharded(gpu_client, [70_000, 50_001, 80_000], 64)
    Y = torch.cat([local[:5], torch.randn(200, 64, device="cuda")])
    d0, i0 = kneighbors(local, Y, 10)
    d1, i1 = kneighbors(X, Y.cpu().numpy(), 10)
    np.testing.assert_array_equal(i1, i0.cpu().numpy())
    np.testing.assert_allclose(d1, d0.cpu().numpy(), rtol=1e-12, atol=1e-12)


def test_fuzzy_kmeans_fused_on_gpus_equals_one_gpu(gpu_client):
    from densitas.cluster import FuzzyKMeans

    X, local, _keep = _sharded(gpu_client, [300_000, 200_000], 10)
    init = local[::50_000][:10].double().cpu().numpy()
    kw = {"n_nearest": 2, "fuzzifier": 2.0, "init": init, "max_iter": 8, "tol": 0.0}
    one = FuzzyKMeans(10, **kw).fit(local)
    many = FuzzyKMeans(10, **kw).fit(X)
    assert many.centroid_update_ == one.centroid_update_ == "fused"
    np.testing.assert_allclose(many.cluster_centers_, one.cluster_centers_, rtol=1e-6, atol=1e-7)
    assert many.n_iter_ == one.n_iter_


def test_bandwidth_on_gpu_workers_equals_one_gpu(gpu_client):
    from densitas.kde import bandwidth
    from densitas.kde.distributed import bandwidth_dask

    x = np.random.default_rng(3).normal(size=30_000)
    # LSCV_h's zoom stops at 1e-4 in h, and the CUDA pair sums are float32 with float64 accumulation: sums
    # differing by ~1e-7 may pick a neighbouring zoom point, so its agreement is the search's own precision
    for method, engine, rel in (("plugin", "exact", 1e-6), ("plugin", "binned", 1e-6), ("lscv_h", "exact", 2e-4)):
        one = bandwidth(x, method, engine=engine, device="cuda")
        many = bandwidth_dask(da.from_array(x, chunks=10_000), method, engine=engine, device="cuda")
        assert many == pytest.approx(one, rel=rel)
