"""The calibrator registry: built-ins, a real third-party plugin, shadowing, unknown names.

The plugin is the distribution in ``tests/plugin_pkg``, made visible to these tests only
through a test-only entry point (the ``example_plugin`` fixture of ``conftest.py`` puts its
package and a generated ``.dist-info`` on ``sys.path``): the README's test command installs
nothing but privcal and its test extras. These tests fail, not skip, when it is not found.
"""

from __future__ import annotations

import random
import warnings
from importlib import metadata

import numpy as np
import pytest

from privcal.calibrators import registry
from privcal.calibrators.base import (
    CalibrationInput,
    Calibrator,
    CalibratorParams,
    DataShape,
)
from privcal.errors import NotFound

PLUGIN_DIST = "privcal-example-plugin"
INSTALL_HINT = "the conftest's example_plugin fixture should have made it visible"


@pytest.fixture(autouse=True)
def _fresh_registry(example_plugin):
    registry.clear_cache()
    yield
    registry.clear_cache()


def _require_plugin() -> str:
    try:
        return metadata.version(PLUGIN_DIST)
    except metadata.PackageNotFoundError:
        pytest.fail(f"the example plugin {PLUGIN_DIST!r} is not installed: {INSTALL_HINT}")


def test_plugin_discovered_with_distribution_and_version():
    version = _require_plugin()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the shadowing entry point warns; tested below
        reg = registry.get("example-max")
    assert reg.distribution == PLUGIN_DIST
    assert reg.distribution_version == version == "0.3.1"
    cal = reg.calibrator
    assert isinstance(cal, Calibrator)
    assert cal.name == "example-max"
    assert "example-max" in registry.names()
    params = cal.Params(alpha=0.1)
    assert isinstance(params, CalibratorParams)
    scores = np.array([0.3, 0.9, 0.1])
    res = cal.calibrate(CalibrationInput(scores=scores), params, random.Random(0))
    assert res.threshold == 0.9
    assert cal.guarantee(params, DataShape(n=3)).lower == pytest.approx(0.75)


def test_shadowing_a_builtin_is_ignored_with_a_warning():
    _require_plugin()
    eps = [
        ep for ep in metadata.entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "split"
    ]
    assert eps, f"the plugin's shadowing entry point 'split' is missing: {INSTALL_HINT}"
    with pytest.warns(UserWarning, match="'split'.*cannot be shadowed"):
        names = registry.names()
    assert names.count("split") == 1
    reg = registry.get("split")
    assert reg.distribution == "privcal"
    assert type(reg.calibrator).__module__ == "privcal.calibrators.split"


def test_builtins_load_and_satisfy_the_protocol():
    for name in ("split", "pcoqs", "exponq"):
        reg = registry.get(name)
        cal = reg.calibrator
        assert isinstance(cal, Calibrator), name
        assert cal.name == name
        assert reg.distribution == "privcal"
        assert cal.inputs == frozenset({"scores"})
        assert cal.summary and "\n" not in cal.summary
        assert issubclass(cal.Params, CalibratorParams)
        # every parameter has a description: the CLI builds its options from them
        for field_name, field in cal.Params.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"


def test_unknown_name_raises_not_found_listing_names():
    _require_plugin()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotFound) as exc:
            registry.get("no-such-method")
    msg = str(exc.value)
    assert "no-such-method" in msg
    for name in ("split", "pcoqs", "exponq", "example-max"):
        assert name in msg
    assert "\n" not in msg
