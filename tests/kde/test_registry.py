"""The selector registry drives validation, METHODS, the documentation and these tests: every test here
iterates the registry, so a new selector is checked without editing this file."""

from __future__ import annotations

import numpy as np
import pytest

from densitas.exceptions import InputError
from densitas.kde import METHODS, bandwidth
from densitas.kde.registry import OptionError
from densitas.kde.selectors import ENGINES, SELECTORS

SMALL = {"maxiter": 3}  # keeps lscv_H cheap where an option's default is compared with its explicit value
BAD_VALUES = {"int": [0, True, 2.5, "many"], "choice": ["bogus", 3, None]}


def _data(rng, selector, d=None):
    d = d or (1 if selector.univariate else 2)
    x = rng.normal(size=(150, d)) @ np.array([[1.0, 0.4], [0.0, 0.6]])[:d, :d]
    return x[:, 0] if d == 1 else x


def _options(selector):
    return [(selector.name, o) for o in selector.options]


ALL_OPTIONS = [pair for s in SELECTORS for pair in _options(s)]


def test_methods_tuple_is_the_registry():
    assert METHODS == SELECTORS.names() and len(SELECTORS) == len(set(METHODS))


@pytest.mark.parametrize("method", SELECTORS.names())
def test_every_selector_gives_a_valid_bandwidth(rng, method):
    sel = SELECTORS[method]
    h = bandwidth(_data(rng, sel, 1), method, device="cpu")
    assert isinstance(h, float) and 0.05 < h < 2.0
    if not sel.univariate:
        H = bandwidth(_data(rng, sel, 2), method, device="cpu")
        assert H.shape == (2, 2) and np.allclose(H, H.T) and np.all(np.linalg.eigvalsh(H) > 0)


@pytest.mark.parametrize("method,option", ALL_OPTIONS, ids=[f"{m}-{o.name}" for m, o in ALL_OPTIONS])
def test_option_default_is_what_omitting_it_does(rng, method, option):
    sel = SELECTORS[method]
    x = _data(rng, sel)
    extra = {k: v for k, v in SMALL.items() if k in {o.name for o in sel.options} and k != option.name}
    omitted = bandwidth(x, method, device="cpu", **extra)
    default = option.default
    if default is None:  # "the method's own default": None must behave as omitting it
        explicit = bandwidth(x, method, device="cpu", **extra, **{option.name: None})
    else:
        explicit = bandwidth(x, method, device="cpu", **extra, **{option.name: default})
    np.testing.assert_array_equal(explicit, omitted)


@pytest.mark.parametrize("method,option", ALL_OPTIONS, ids=[f"{m}-{o.name}" for m, o in ALL_OPTIONS])
def test_option_bad_values_are_refused_by_name(method, option):
    kind = "int" if "int" in option.check.describe else "choice"
    for bad in BAD_VALUES[kind]:
        with pytest.raises(OptionError) as err:
            bandwidth(np.array([0.1, 0.5, 0.9, 2.0]), method, **{option.name: bad})
        assert err.value.option == option.name and err.value.method == method


@pytest.mark.parametrize("method", SELECTORS.names())
def test_unknown_option_is_refused(method):
    with pytest.raises(OptionError) as err:
        bandwidth(np.array([0.1, 0.5, 0.9, 2.0]), method, bandwidth_factor=2.0)
    assert err.value.option == "bandwidth_factor"


@pytest.mark.parametrize("method", SELECTORS.names())
def test_engines_outside_the_registry_are_refused(rng, method):
    sel = SELECTORS[method]
    x = _data(rng, sel, 1)
    for engine in ENGINES:
        if engine not in sel.engines:
            with pytest.raises(InputError):
                bandwidth(x, method, engine=engine)
    if sel.binned_univariate:
        with pytest.raises(InputError):
            bandwidth(_data(rng, sel, 2), method, engine="binned")


@pytest.mark.parametrize("method", [s.name for s in SELECTORS if s.univariate])
def test_univariate_selectors(rng, method):
    x = rng.normal(size=200)
    with pytest.raises(InputError):
        bandwidth(np.c_[x, rng.normal(size=200)], method)
    h = bandwidth(x, method, device="cpu")
    np.testing.assert_allclose(bandwidth(x[:, None], method, device="cpu"), [[h * h]], rtol=1e-12)


def test_docstring_and_table_list_every_method_and_option():
    table = SELECTORS.table()
    for sel in SELECTORS:
        assert f'``"{sel.name}"``' in bandwidth.__doc__ and f"`{sel.name}`" in table
        for option in sel.options:
            assert f"``{option.name}``" in bandwidth.__doc__ and f"``{option.name}``" in table
