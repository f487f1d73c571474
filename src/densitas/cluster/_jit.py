"""Classic fuzzy c-means with q = 2 as one compiled loop over the rows of a chunk (Numba), for small k and d.

At the shapes fuzzy c-means is mostly run at (a handful of clusters, tens of features) the two GEMMs of
:func:`densitas.cluster._cpu.classic_pass` are far from the BLAS's speed: a (k × (d + 2)) · ((d + 2) × m) product
with k = 5 leaves most of each register tile empty, and both GEMMs read the chunk. On one AMD EPYC (Zen 5) core they
ran at ~10 GFLOP/s against 49 for a square DGEMM (benchmarks/RESULTS.md, 2026-11-23). Here every row's work stays
in registers: for each row ``x`` of the chunk,

1. the k squared distances ``D_j = Σ_f (x_f − c_jf)²`` (differences, not the expanded norms: no cancellation);
2. a check that every ``D_j`` is above the floor of the fast rule (else the chunk is redone by the general rule,
   as in :func:`~densitas.cluster._cpu.classic_pass`);
3. ``a_j = 1/D_j``, ``r = 1/Σ_j a_j`` (the row's term of the objective, ``Σ_j u_j² D_j = r``), ``u_j = a_j r``;
4. ``w_j = u_j²`` added into the k × (d + 1) sums ``[Σ w_j x, Σ w_j]``, kept as scalars;
5. the nearest centroid (ties to the lower index), for the labels.

The loop body is generated for the given (k, d), so that the centroids and the k(d + 1) sums are scalars the
compiler keeps in registers (or on the stack) and the loop over rows is vectorised. The source is written once
per shape to a cache directory (:func:`cache_dir`: ``DENSITAS_CACHE_DIR/jit``, else
``$XDG_CACHE_HOME/densitas/jit`` or ``~/.cache/densitas/jit``) and compiled with Numba's on-disk cache, so the
~2 s compile happens once per machine and shape; where the directory cannot be used it is compiled in memory,
once per process. Without Numba, for shapes past :data:`MAX_SUMS`, or if Numba fails to compile, the GEMM pass
runs instead.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["MAX_SUMS", "MIN_ROWS", "cache_dir", "classic_kernel", "kernel_source"]

#: The largest k(d + 1) (sums kept as scalars) the generated kernel is used for: past it the scalars spill, the
#: first compile grows with k·d (6–11 s at k(d + 1) = 128–160 on a loaded 2-core machine), and the GEMMs of the
#: pass get closer to the BLAS's speed.
MAX_SUMS = 96
#: The fewest rows for which :class:`~densitas.cluster.FuzzyKMeans` takes the kernel: below, one pass is well
#: under a millisecond either way and a first compile (~2 s per shape on a new machine) would dominate.
MIN_ROWS = 65_536

#: Bumped when the generated source changes meaning; part of the cached file's name with the source's hash.
_VERSION = 2
_FASTMATH = {"reassoc", "contract", "nsz"}  # vectorised sums; no reciprocal approximations ("arcp" is left out)


def kernel_source(k: int, d: int, m: int | None = None) -> str:
    """Python source of the kernel for ``k`` centroids of ``d`` features (the module docstring's five steps).

    The function it defines, ``kernel(Xt, s, e, C, floor, sums, labels)``, reads the rows ``s:e`` of the
    transposed data ``Xt`` ((≥ d) × n, float64, rows contiguous) and the centroids ``C`` (k × d), writes
    ``[Σ w x, Σ w]`` of those rows to ``sums`` (k × (d + 1)) and each row's nearest centroid (ties to the lower
    index) to ``labels[0:e − s]`` (int64), and returns ``(objective, ok)``; ``ok`` is False when a distance was not
    above ``floor`` (or NaN), and the sums and objective are then not to be used (the labels are).

    With ``m < k`` (Generalized Fuzzy k-Means, document 004) a row's memberships are over its ``m`` nearest
    centroids only, ties to the lower index: centroid j is among them when fewer than m others are nearer
    (``D_l < D_j``, or ``D_l = D_j`` with ``l < j``), and the others get weight 0.

    Examples
    --------
    >>> src = kernel_source(2, 1)
    >>> print(src.splitlines()[0])
    def kernel(Xt, s, e, C, floor, sums, labels):
    >>> "d1 = (x0 - c1_0) * (x0 - c1_0)" in src
    True
    """
    feats, clusters = range(d), range(k)
    lines = ["def kernel(Xt, s, e, C, floor, sums, labels):"]
    lines += [f"    r{f} = Xt[{f}, s:e]" for f in feats]
    lines += [f"    c{j}_{f} = C[{j}, {f}]" for j in clusters for f in feats]
    lines += [f"    s{j}_{f} = 0.0" for j in clusters for f in range(d + 1)]
    lines += ["    J = 0.0", "    bad = 0", "    for i in range(e - s):"]
    lines += [f"        x{f} = r{f}[i]" for f in feats]
    for j in clusters:
        lines.append(f"        d{j} = " + " + ".join(f"(x{f} - c{j}_{f}) * (x{f} - c{j}_{f})" for f in feats))
    lines.append("        bad += 1 - ((" + ") & (".join(f"d{j} > floor" for j in clusters) + "))")
    lines += ["        best = d0", "        lab = 0"]
    for j in range(1, k):  # the nearest centroid, ties to the lower index
        lines += [f"        closer = d{j} < best", f"        best = d{j} if closer else best",
                  f"        lab = {j} if closer else lab"]
    lines.append("        labels[i] = lab")
    if m is None or m >= k:
        lines += [f"        a{j} = 1.0 / d{j}" for j in clusters]
    else:  # the m nearest (ties to the lower index) by rank: the others get a = 0, hence u = w = 0
        for j in clusters:
            nearer = [f"(d{i} <= d{j})" for i in clusters if i < j] + [f"(d{i} < d{j})" for i in clusters if i > j]
            lines.append(f"        a{j} = 1.0 / d{j} if (" + " + ".join(nearer) + f") < {m} else 0.0")
    lines.append("        r = 1.0 / (" + " + ".join(f"a{j}" for j in clusters) + ")")
    lines.append("        J += r")
    for j in clusters:
        lines += [f"        u{j} = a{j} * r", f"        w{j} = u{j} * u{j}"]
        lines += [f"        s{j}_{f} += w{j} * x{f}" for f in feats]
        lines.append(f"        s{j}_{d} += w{j}")
    lines += [f"    sums[{j}, {f}] = s{j}_{f}" for j in clusters for f in range(d + 1)]
    lines.append("    return J, bad == 0")
    return "\n".join(lines) + "\n"


def classic_kernel(k: int, d: int, m: int | None = None) -> Callable | None:
    """The compiled kernel of :func:`kernel_source` for (k, d, m), or None when Numba is not installed, fails, or
    ``k (d + 1)`` is past :data:`MAX_SUMS` (the caller then runs the GEMM pass). Compiled when first asked for,
    from the on-disk cache where it can be.

    Examples
    --------
    >>> import numpy as np
    >>> kern = classic_kernel(2, 1)
    >>> Xt = np.array([[0.0, 1.0, 3.0]])
    >>> sums, labels = np.empty((2, 2)), np.empty(3, dtype=np.int64)
    >>> J, ok = kern(Xt, 0, 3, np.array([[0.5], [2.5]]), 1e-300, sums, labels) if kern else (0.0, False)
    >>> bool(ok) or kern is None
    True
    """
    return _kernel(int(k), int(d), None if m is None or m >= k else int(m))  # m ≥ k: the classic kernel


@functools.lru_cache(maxsize=64)
def _kernel(k: int, d: int, m: int | None) -> Callable | None:
    """:func:`classic_kernel` once per (k, d, m), m None for every centroid."""
    if k * (d + 1) > MAX_SUMS:
        return None
    try:
        import numba
    except ImportError:
        return None
    source = kernel_source(k, d, m)
    digest = hashlib.sha1(f"{_VERSION}\n{source}".encode()).hexdigest()[:12]
    module = _load_module(f"densitas_fcm_k{k}_d{d}{'' if m is None else f'_m{m}'}_{digest}", source)
    if module is not None:
        kernel = _compiled(numba, module.kernel, cache=True)
        if kernel is not None:
            return kernel
    namespace: dict = {}  # no usable cache: compiled in memory, once per process
    exec(compile(source, f"<densitas fcm kernel k={k} d={d}>", "exec"), namespace)
    return _compiled(numba, namespace["kernel"], cache=False)


def _compiled(numba, fn: Callable, cache: bool) -> Callable | None:
    """``fn`` compiled now for the one signature the pass calls it with (C-contiguous float64 data, centroids and
    sums, int64 labels), or None if Numba fails (the caller then runs the GEMM steps): a compile or cache error
    must not reach a fit, nor surface later from the pass's threads."""
    f64, i64 = numba.types.float64, numba.types.int64
    signature = numba.types.Tuple((f64, numba.types.boolean))(
        f64[:, ::1], i64, i64, f64[:, ::1], f64, f64[:, ::1], i64[::1])
    try:
        return numba.njit(signature, nogil=True, fastmath=_FASTMATH, boundscheck=False, error_model="numpy",
                          cache=cache)(fn)
    except Exception:  # any Numba failure: fall back, never fail the fit
        return None


def cache_dir() -> Path:
    """Where generated kernels are written: ``DENSITAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/densitas/jit`` or
    ``~/.cache/densitas/jit``.

    Examples
    --------
    >>> cache_dir().name
    'jit'
    """
    if os.environ.get("DENSITAS_CACHE_DIR"):
        return Path(os.environ["DENSITAS_CACHE_DIR"]) / "jit"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "densitas" / "jit"


def _load_module(name: str, source: str):
    """Import ``source`` from ``<cache_dir>/<name>.py`` (written atomically when absent or different), so that
    Numba can cache the compiled code beside it; None if the directory cannot be written."""
    if name in sys.modules:
        return sys.modules[name]
    tmp = None
    try:
        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.py"
        if not path.exists() or path.read_bytes() != source.encode():
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                fh.write(source)
            os.chmod(tmp, 0o644)  # readable by the other users of a shared cache directory
            os.replace(tmp, path)
            tmp = None
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, SyntaxError, ValueError):  # unwritable, or a file another process left half-written
        return None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
    sys.modules[name] = module
    return module
