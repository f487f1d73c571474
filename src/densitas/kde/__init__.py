"""Kernel density estimation and bandwidth selection (documents 000 and 003).

* :func:`bandwidth` — scott, silverman, plugin, lscv_h, lscv_H, isj; exact (O(n²) tiled pair sums, Triton on
  CUDA) or binned (linear binning + FFT) engines.
* :func:`lscv_objective`, :func:`plugin_functional` — the criteria themselves.
* :class:`KernelDensity` — a scikit-learn estimator.
"""

from densitas.kde.estimator import KernelDensity
from densitas.kde.kernels import KERNELS
from densitas.kde.selectors import ENGINES, METHODS, bandwidth, lscv_objective, plugin_functional

__all__ = ["ENGINES", "KERNELS", "METHODS", "KernelDensity", "bandwidth", "lscv_objective", "plugin_functional"]
