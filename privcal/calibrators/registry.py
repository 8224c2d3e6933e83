"""Find calibrators by name: the built-ins, plus third-party ones from the entry-point group
``privcal.calibrators`` (discovered lazily, on first lookup of a name that is not built in).

A plugin is a distribution that declares, in its ``pyproject.toml``::

    [project.entry-points."privcal.calibrators"]
    my-method = "my_package.module:MyCalibrator"

where ``MyCalibrator`` is a class (or instance) satisfying
:class:`privcal.calibrators.base.Calibrator`. Built-in names cannot be shadowed:
a plugin using one is ignored with a warning.

``levels:NAME`` and ``mondrian:NAME`` (and ``mondrian:levels:NAME``) name a wrapper around
the calibrator NAME (:mod:`privcal.calibrators.levels`, :mod:`privcal.calibrators.mondrian`);
a release records such a name, so ``audit verify`` rebuilds the same wrapper.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from privcal.calibrators.base import Calibrator
from privcal.errors import InvalidInput, NotFound

ENTRY_POINT_GROUP = "privcal.calibrators"

#: name → "module:attribute"; imported only when asked for.
BUILTINS: dict[str, str] = {
    "split": "privcal.calibrators.split:SplitConformal",
    "pcoqs": "privcal.calibrators.pcoqs:PCOQS",
    "exponq": "privcal.calibrators.exponq:ExponQ",
    "ldp-label": "privcal.calibrators.ldp_label:LDPLabel",
    "ldp-score": "privcal.calibrators.ldp_score:LDPScore",
    "fedcp-qq": "privcal.calibrators.fedcp_qq:FedCPQQ",
    "fedcp2-qq": "privcal.calibrators.fedcp2_qq:FedCP2QQ",
}


@dataclass(frozen=True)
class Registered:
    """A calibrator and where it came from (recorded in every release)."""

    calibrator: Calibrator
    distribution: str
    distribution_version: str


def _instantiate(obj: object, where: str) -> Calibrator:
    inst = obj() if isinstance(obj, type) else obj
    if not isinstance(inst, Calibrator):
        raise TypeError(f"{where} does not implement the privcal Calibrator protocol")
    return inst


def _load_builtin(name: str) -> Registered:
    module, attr = BUILTINS[name].split(":")
    cal = _instantiate(getattr(importlib.import_module(module), attr), BUILTINS[name])
    return Registered(cal, "privcal", _privcal_version())


def _privcal_version() -> str:
    try:
        return metadata.version("privcal")
    except metadata.PackageNotFoundError:  # running from a source tree
        from privcal import __version__

        return __version__


_warned: set[str] = set()


@cache
def _plugin_entry_points() -> dict[str, metadata.EntryPoint]:
    found: dict[str, metadata.EntryPoint] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in BUILTINS:
            if ep.name in _warned:
                continue
            _warned.add(ep.name)
            warnings.warn(
                f"ignoring plugin calibrator {ep.name!r} from {ep.value}: "
                "built-in calibrator names cannot be shadowed",
                stacklevel=2,
            )
            continue
        found.setdefault(ep.name, ep)
    return found


#: wrapper prefix → "module:class" (the class takes the inner calibrator)
WRAPPERS: dict[str, str] = {
    "levels": "privcal.calibrators.levels:Levels",
    "mondrian": "privcal.calibrators.mondrian:Mondrian",
}


@cache
def get(name: str) -> Registered:
    """The calibrator called ``name``; raises :class:`NotFound` listing what exists."""
    prefix, sep, rest = name.partition(":")
    if sep and prefix in WRAPPERS:
        inner = get(rest)
        module, attr = WRAPPERS[prefix].split(":")
        wrapper = getattr(importlib.import_module(module), attr)(inner.calibrator)
        return Registered(wrapper, inner.distribution, inner.distribution_version)
    if name in BUILTINS:
        return _load_builtin(name)
    ep = _plugin_entry_points().get(name)
    if ep is None:
        known = ", ".join(sorted(names()))
        raise NotFound(f"unknown calibrator {name!r} (known: {known})")
    cal = _instantiate(ep.load(), ep.value)
    dist = ep.dist
    return Registered(
        cal,
        dist.metadata["Name"] if dist is not None else ep.module,
        dist.version if dist is not None else "unknown",
    )


def _same_implementation(a: object, b: object) -> bool:
    """Whether ``a`` and ``b`` are the same calibrator class (a wrapper's inner ones too; by
    module and qualified name, so a reloaded module's class is still itself)."""
    ta, tb = type(a), type(b)
    if ta is not tb and (ta.__module__, ta.__qualname__) != (tb.__module__, tb.__qualname__):
        return False
    inner_a, inner_b = getattr(a, "inner", None), getattr(b, "inner", None)
    return (inner_a is None and inner_b is None) or _same_implementation(inner_a, inner_b)


def provenance(cal: Calibrator, given: Registered | None = None) -> Registered:
    """Where a calibrator object passed by a caller comes from, as a release records it: the
    registered one if ``cal`` is of the class registered under its name (a built-in: privcal
    and its version); if its name is not registered, ``given`` or else its own module's
    package and version ``unknown``. A calibrator of another class that calls itself by a
    registered name is refused: its release would record that method's mechanism and
    guarantee (``audit verify`` recomputes the registered method's) while another ran."""
    try:
        reg = get(cal.name)
    except NotFound:
        return given if given is not None else Registered(
            cal, type(cal).__module__.split(".")[0], "unknown")
    if not _same_implementation(cal, reg.calibrator):
        raise InvalidInput(
            f"calibrator {cal.name!r} is {reg.distribution}'s; this one is a "
            f"{type(cal).__module__}.{type(cal).__qualname__}: give it a name of its own")
    return reg


def names() -> list[str]:
    """Every calibrator name: the built-ins first, then plugins, each group sorted."""
    return list(BUILTINS) + sorted(_plugin_entry_points())


def clear_cache() -> None:
    """Forget discovered plugins (after installing one in a running process)."""
    get.cache_clear()
    _plugin_entry_points.cache_clear()
    _warned.clear()
