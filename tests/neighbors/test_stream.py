"""The streamed search over host-resident references (densitas.neighbors.stream) on CPU tensors: the chunk loop,
the per-chunk candidates (PyTorch's fast pass, and the fused kernel in the Triton interpreter), the merge on the
device and the certificate's fallback, with tiny budgets, against a float64 brute force (ties by lower row)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densitas._backend.dispatch import use_backend
from densitas.exceptions import InputError
from densitas.neighbors import kneighbors
from densitas.neighbors.stream import HostChunks, NonFiniteError, StreamStats, stream_kneighbors


def _brute(Y: np.ndarray, X: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Float64 squared distances by direct differences, the k first by (distance, row)."""
    d = ((Y[:, None, :].astype(np.float64) - X[None, :, :].astype(np.float64)) ** 2).sum(-1)
    rows = np.broadcast_to(np.arange(len(X)), d.shape)
    o = np.lexsort((rows, d), axis=1)[:, :k]
    return np.take_along_axis(d, o, 1), o


def _data(seeded, n: int, m: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    X = seeded.integers(0, 3, (n, d)).astype(np.float32)  # many exact ties
    X[n // 3:n // 3 + 40] = X[2]  # 41 copies of row 2: more ties than candidates in one chunk
    X[-5:] += 40.0  # far rows: the centring of the first chunk does not fit them
    Y = np.concatenate([X[[2, 0, n - 1]], seeded.integers(0, 3, (m - 3, d)).astype(np.float32)])
    return X, Y


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize(("k", "chunk_rows"), [(1, 64), (3, 50), (6, None)])
def test_streamed_search_equals_float64_brute_force(seeded, backend, k, chunk_rows):
    X, Y = _data(seeded, 150, 6, 4)
    rd, ri = _brute(Y, X, k)
    stats = StreamStats()
    with use_backend(backend):
        D, I_ = stream_kneighbors(Y, X, k, metric="sqeuclidean", memory_budget="64kB", chunk_rows=chunk_rows,
                                  stats=stats)
    assert stats.backend == backend
    assert stats.chunks >= 2
    np.testing.assert_array_equal(I_.numpy(), ri)
    np.testing.assert_allclose(D.numpy(), rd, rtol=1e-12, atol=0)
    if chunk_rows is not None:  # a chunk holds more than kp = 16 copies of the first query: not certified
        assert stats.fallback_queries >= 1


def test_any_chunking_gives_the_in_memory_answer(seeded):
    X = seeded.standard_normal((400, 7)).astype(np.float32)
    X[100:140] = X[5]
    Y = np.concatenate([X[:4], seeded.standard_normal((5, 7)).astype(np.float32)])
    want_d, want_i = kneighbors(X, Y, 12, device="cpu")
    with use_backend("torch"):
        for rows in (1, 33, 64, 399, 400):
            D, I_ = stream_kneighbors(Y, torch.from_numpy(X), 12, chunk_rows=rows, memory_budget="16kB")
            np.testing.assert_array_equal(I_.numpy(), want_i)
            np.testing.assert_allclose(D.numpy(), want_d, rtol=1e-14, atol=0)
        # the budget alone plans the chunks and query tiles
        stats = StreamStats()
        D, I_ = stream_kneighbors(Y, X, 12, memory_budget="20kB", stats=stats)
    assert stats.chunks > 1 and stats.query_tiles > 1
    np.testing.assert_array_equal(I_.numpy(), want_i)


def test_chunks_from_a_reader(seeded, tmp_path):
    """References given as consecutive chunks (a file read block by block): the same answer."""
    X, Y = _data(seeded, 130, 5, 3)
    path = tmp_path / "x.npy"
    np.save(path, X)

    def blocks(rows):
        arr = np.load(path, mmap_mode="r")
        for s in range(0, len(arr), rows):
            yield s, np.array(arr[s:s + rows])

    src = HostChunks(blocks=blocks, n_rows=len(X), width=X.shape[1])
    with use_backend("torch"):
        D, I_ = stream_kneighbors(torch.from_numpy(Y), src, 4, memory_budget="8kB", chunk_rows=40)
    rd, ri = _brute(Y, X, 4)
    np.testing.assert_array_equal(I_.numpy(), ri)
    np.testing.assert_allclose(D.numpy(), np.sqrt(rd), rtol=1e-12)


def test_k_equal_to_n_and_one_row_chunks(seeded):
    X, Y = _data(seeded, 40, 4, 2)
    rd, ri = _brute(Y, X, 40)
    with use_backend("torch"):
        D, I_ = stream_kneighbors(Y, X, 40, metric="sqeuclidean", chunk_rows=7)
    np.testing.assert_array_equal(I_.numpy(), ri)
    np.testing.assert_allclose(D.numpy(), rd, rtol=1e-12)


def test_bad_input_raises():
    X = np.zeros((10, 2), dtype=np.float32)
    with pytest.raises(InputError, match="'k' parameter of stream_kneighbors"):
        stream_kneighbors([[0.0, 0.0]], X, 11)
    with pytest.raises(InputError, match="'metric' parameter of stream_kneighbors"):
        stream_kneighbors([[0.0, 0.0]], X, 1, metric="manhattan")
    with pytest.raises(InputError, match="2 columns"):
        stream_kneighbors([[0.0, 0.0, 0.0]], X, 1)
    with pytest.raises(InputError, match="float32 values in host memory"):
        HostChunks(np.zeros((3, 2)))
    with pytest.raises(InputError, match="at most 256 candidates"):
        stream_kneighbors(np.zeros((1, 2), np.float32), np.zeros((400, 2), np.float32), 300)
    Xn = X.copy()
    Xn[7, 1] = np.nan
    with pytest.raises(NonFiniteError, match="references hold NaN"), use_backend("torch"):
        stream_kneighbors([[0.0, 0.0]], Xn, 1, chunk_rows=3)
    with pytest.raises(NonFiniteError, match="queries hold NaN"):
        stream_kneighbors([[np.nan, 0.0]], X, 1)


@pytest.mark.parametrize("kind", ["npy", "parquet", "duckdb"])
def test_file_and_table_sources_stream_with_queries_matched_by_name(seeded, tmp_path, kind):
    """What kneighbors streams on CUDA for a file or DuckDB relation (api.host_source), run on the CPU: the
    same answer as the in-memory search, DataFrame queries matched to the columns by name."""
    import pandas as pd

    from densitas.neighbors.api import host_source

    X = seeded.standard_normal((300, 3)).astype(np.float32)
    X[100:130] = X[4]
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    Y = frame.iloc[[4, 7, 200]].reset_index(drop=True)
    if kind == "npy":
        src_arg, queries = tmp_path / "x.npy", Y.to_numpy()
        np.save(src_arg, X)
    elif kind == "parquet":
        src_arg, queries = str(tmp_path / "x.parquet"), Y[["c", "a", "b"]]  # reordered: matched by name
        frame.to_parquet(src_arg)
    else:
        import duckdb

        con = duckdb.connect()
        con.register("frame", frame)
        con.execute("CREATE TABLE t AS SELECT a::FLOAT AS a, b::FLOAT AS b, c::FLOAT AS c FROM frame")
        src_arg, queries = con.table("t"), Y[["b", "c", "a"]]
    got = host_source(src_arg, queries, "raise", torch.device("cpu"))
    assert got is not None
    src, q = got
    assert src.n_rows == 300 and src.width == 3
    want_d, want_i = kneighbors(X, Y.to_numpy(), 7, device="cpu")
    with use_backend("torch"):
        D, I_ = stream_kneighbors(q, src, 7, memory_budget="16kB", chunk_rows=64)
    np.testing.assert_array_equal(I_.numpy(), want_i)
    np.testing.assert_allclose(D.numpy(), want_d, rtol=1e-14, atol=0)


def test_host_source_declines_what_it_cannot_stream():
    from densitas.neighbors.api import host_source

    cpu = torch.device("cpu")
    assert host_source(np.zeros((5, 2)), np.zeros((1, 2)), "raise", cpu) is None  # float64 references
    assert host_source(np.zeros((5, 2), np.float32), np.zeros((1, 3)), "raise", cpu) is None  # widths differ
    assert host_source([[1.0, 2.0]], [[1.0, 2.0]], "raise", cpu) is None  # a list: the general path
    assert host_source(np.zeros((5, 2), np.float32), [["a", "b"]], "raise", cpu) is None  # text queries


def test_streamed_search_with_half_operands_equals_float64_brute_force(seeded, monkeypatch):
    """The chunk kernel with float16 operands (``STREAM_PRECISION = "fp16"``) and its rounding bound."""
    from densitas.neighbors import stream

    monkeypatch.setattr(stream, "STREAM_PRECISION", "fp16")
    X, Y = _data(seeded, 150, 6, 4)
    Y = np.concatenate([Y, seeded.normal(size=(3, 4)).astype(np.float32)])
    rd, ri = _brute(Y, X, 5)
    stats = StreamStats()
    with use_backend("triton"):
        D, I_ = stream_kneighbors(Y, X, 5, metric="sqeuclidean", memory_budget="64kB", chunk_rows=64, stats=stats)
    assert stats.backend == "triton" and stats.chunks >= 2
    np.testing.assert_array_equal(I_.numpy(), ri)
    np.testing.assert_allclose(D.numpy(), rd, rtol=1e-12, atol=0)
