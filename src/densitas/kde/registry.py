"""The bandwidth-selector registry: name → function, its options (validator and default), the dimensions and
engines it supports. One table drives :func:`densitas.kde.bandwidth`'s validation, its ``METHODS``, the
documentation (:func:`SelectorRegistry.table`) and the tests' parametrisation, as KDEpy's registries do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from densitas.exceptions import InputError

__all__ = ["Option", "OptionError", "Selector", "SelectorRegistry", "choice", "int_at_least"]


class OptionError(InputError):
    """A selector option that is unknown to the method, or has a bad value; ``method`` and ``option`` name them
    (``option`` is None when several unknown options were given).

    Examples
    --------
    >>> err = OptionError("lscv_H", "optimizer", "The 'optimizer' option of method 'lscv_H' must be ...")
    >>> err.option, isinstance(err, ValueError)
    ('optimizer', True)
    """

    def __init__(self, method: str, option: str | None, message: str):
        super().__init__(message)
        self.method = method
        self.option = option


Validator = Callable[[str, str, Any], Any]  # (method, option, value) -> normalised value, or raise OptionError


def choice(*values: str, aliases: Mapping[str, str] | None = None) -> Validator:
    """A validator accepting one of ``values`` (or an alias of one, returned normalised).

    Examples
    --------
    >>> choice("full", "diagonal")("scott", "covariance", "diagonal")
    'diagonal'
    """
    aliases = dict(aliases or {})

    def check(method: str, option: str, value: Any) -> Any:
        if isinstance(value, str) and value in values:
            return value
        if isinstance(value, str) and value in aliases:
            return aliases[value]
        allowed = " or ".join(repr(v) for v in (*values, *aliases))
        raise OptionError(method, option, f"The {option!r} option of method {method!r} must be {allowed}. Got "
                                          f"{value!r} instead.")

    check.describe = ", ".join(repr(v) for v in values)  # type: ignore[attr-defined]
    return check


def int_at_least(minimum: int, *, none_ok: bool = False) -> Validator:
    """A validator accepting an int ≥ ``minimum`` (and None when ``none_ok``: the method's own default).

    Examples
    --------
    >>> int_at_least(64)("isj", "grid_size", 1024)
    1024
    """

    def check(method: str, option: str, value: Any) -> Any:
        if value is None and none_ok:
            return None
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
            raise OptionError(method, option, f"The {option!r} option of method {method!r} must be an int ≥ "
                                              f"{minimum}. Got {value!r} instead.")
        return int(value)

    check.describe = f"int ≥ {minimum}"  # type: ignore[attr-defined]
    return check


@dataclass(frozen=True)
class Option:
    """One option of a selector: its name, default, validator and a one-line description.

    Examples
    --------
    >>> Option("grid_size", 1024, int_at_least(64), "grid points.").describe()
    '``grid_size`` (int ≥ 64; default 1024): grid points.'
    """

    name: str
    default: Any
    check: Validator
    doc: str

    def describe(self) -> str:
        """``name = default`` with the accepted values, for the documentation table."""
        values = getattr(self.check, "describe", "")
        default = "auto" if self.default is None else repr(self.default)
        return f"``{self.name}`` ({values}; default {default}): {self.doc}"


@dataclass(frozen=True)
class Selector:
    """A bandwidth selector: ``fn(sample, engine, options) -> h or H``.

    ``univariate``: 1-D data only (a single column also works: its H is ``[[h²]]``). ``engines``: the
    ``engine`` values it accepts (``reason`` says why the others are refused). ``binned_univariate``: its binned
    engine handles 1-D data only. ``pairwise``: its exact engine sums over pairs of rows, O(n²) (the CPU thread
    policy counts its work so); ``auto_exact``: ``engine="auto"`` always means exact (otherwise the device
    policy's row cutoff decides).

    Examples
    --------
    >>> from densitas.kde.selectors import SELECTORS
    >>> SELECTORS["isj"].univariate, SELECTORS["isj"].engines
    (True, ('auto', 'binned'))
    """

    name: str
    fn: Callable[..., Any]
    summary: str
    options: tuple[Option, ...] = ()
    univariate: bool = False
    engines: tuple[str, ...] = ("auto", "exact", "binned")
    reason: str = ""
    binned_univariate: bool = False
    complexity: str = ""
    pairwise: bool = False
    auto_exact: bool = False

    def work(self, rows: int, d: int, exact: bool) -> float:
        """Elements one selection touches, for the CPU thread policy: ``rows² d / 2`` for exact pair sums (per
        pass), ``rows · d`` otherwise."""
        return rows * rows * d / 2.0 if (self.pairwise and exact) else float(rows * d)

    def validate(self, options: Mapping[str, Any], engine: str) -> dict[str, Any]:
        """Options with defaults filled in and values normalised; raises :class:`OptionError` for an unknown
        option or a bad value and :class:`InputError` for an engine the method does not take.

        Examples
        --------
        >>> from densitas.kde.selectors import SELECTORS
        >>> SELECTORS["lscv_H"].validate({"optimizer": "quasi-newton"}, "auto")["optimizer"]
        'bfgs'
        """
        known = {o.name: o for o in self.options}
        extra = sorted(set(options) - set(known))
        if extra:
            raise OptionError(self.name, extra[0] if len(extra) == 1 else None,
                              f"Unknown option(s) {extra} for method {self.name!r}; it accepts {sorted(known)}.")
        if engine not in self.engines:
            raise InputError(f"The 'engine' parameter of bandwidth must be one of {list(self.engines)} for "
                             f"method={self.name!r}{': ' + self.reason if self.reason else ''}. Got {engine!r} "
                             "instead.")
        return {name: o.check(self.name, name, options[name]) if name in options else o.default
                for name, o in known.items()}

    def check_dimensions(self, d: int, engine: str, alternatives: list[str]) -> None:
        """Raise :class:`InputError` if the method cannot take ``d`` columns with ``engine`` (``alternatives``:
        the methods to suggest instead)."""
        if self.univariate and d != 1:
            raise InputError(f"method={self.name!r} is univariate; 'x' has {d} columns. Use one of "
                             f"{alternatives} for multivariate data.")
        if self.binned_univariate and engine == "binned" and d != 1:
            raise InputError(f"engine='binned' supports method={self.name!r} on 1-D data only; use engine='exact' "
                             f"for {d} columns.")


@dataclass
class SelectorRegistry:
    """Name → :class:`Selector`, in registration order.

    Examples
    --------
    >>> from densitas.kde.selectors import SELECTORS
    >>> SELECTORS.names()[:2]
    ('scott', 'silverman')
    """

    _entries: dict[str, Selector] = field(default_factory=dict)

    def register(self, selector: Selector) -> Selector:
        """Add ``selector`` (its name must be new)."""
        if selector.name in self._entries:
            raise InputError(f"A bandwidth selector named {selector.name!r} is already registered.")
        self._entries[selector.name] = selector
        return selector

    def __getitem__(self, name: str) -> Selector:
        return self._entries[name]

    def __iter__(self) -> Iterator[Selector]:
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> tuple[str, ...]:
        """Selector names in registration order."""
        return tuple(self._entries)

    @property
    def multivariate(self) -> list[str]:
        """Names of the selectors that take d-D data."""
        return [s.name for s in self if not s.univariate]

    def table(self) -> str:
        """A Markdown table of the selectors (method, data, engines, options, cost) for the documentation.

        Examples
        --------
        >>> from densitas.kde.selectors import SELECTORS
        >>> SELECTORS.table().splitlines()[0]
        '| method | data | engines | options | cost |'
        """
        rows = ["| method | data | engines | options | cost |", "|---|---|---|---|---|"]
        for s in self:
            data = "1-D" if s.univariate else ("1-D, d-D (binned: 1-D)" if s.binned_univariate else "1-D, d-D")
            opts = "<br>".join(o.describe() for o in s.options) or "—"
            rows.append(f"| `{s.name}` | {data} | {', '.join(s.engines)} | {opts} | {s.complexity} |")
        return "\n".join(rows)
