"""Kernel density estimation and bandwidth selection (documents 000 and 003).

* :func:`bandwidth` — scott, silverman, plugin, lscv_h, lscv_H, isj (the registry :data:`SELECTORS`: name →
  function, options, data and engines); exact (O(n²) tiled pair sums, Triton on CUDA) or binned (linear
  binning + FFT) engines.
* :func:`lscv_objective`, :func:`plugin_functional` — the criteria themselves.
* :class:`KernelDensity` — a scikit-learn estimator.
"""

# Registration: importing the package registers its operations with the dispatch layer (the PyTorch pair sums
# and the Triton ones, lazily); the binned engine's linear binning comes from densitas.primitives, which
# densitas.kde.binned imports.
from densitas.kde import (
    _torch,  # noqa: F401  (registers the PyTorch pair sums)
    _triton_registry,  # noqa: F401  (registers the Triton pair sums, lazily)
)
from densitas.kde.estimator import KernelDensity
from densitas.kde.kernels import KERNELS
from densitas.kde.registry import OptionError
from densitas.kde.selectors import (
    ENGINES,
    METHODS,
    SELECTORS,
    DegenerateBandwidthWarning,
    bandwidth,
    lscv_objective,
    plugin_functional,
)

__all__ = ["ENGINES", "KERNELS", "METHODS", "SELECTORS", "DegenerateBandwidthWarning", "KernelDensity", "OptionError",
           "bandwidth", "lscv_objective", "plugin_functional"]
