"""The bundled example data (privcal/data): loads, is well-formed, and matches its metadata."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import numpy as np
import pytest

from privcal.data import EXAMPLES, ExampleData, load_example
from privcal.errors import NotFound


@pytest.fixture(scope="module")
def digits() -> ExampleData:
    return load_example("digits")


def test_shapes_and_dtypes(digits: ExampleData) -> None:
    assert digits.k == 10
    assert digits.calib_probs.shape == (len(digits.calib_labels), 10)
    assert digits.test_probs.shape == (len(digits.test_labels), 10)
    assert len(digits.calib_labels) >= 500 and len(digits.test_labels) >= 200
    for a in (digits.calib_probs, digits.test_probs):
        assert a.dtype == np.float64
    for a in (digits.calib_labels, digits.test_labels):
        assert a.dtype == np.int64


def test_probabilities_are_valid(digits: ExampleData) -> None:
    for probs in (digits.calib_probs, digits.test_probs):
        assert np.all(np.isfinite(probs))
        assert np.all(probs >= 0)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=0, atol=1e-9)


def test_labels_in_range_and_all_classes_present(digits: ExampleData) -> None:
    for labels in (digits.calib_labels, digits.test_labels):
        assert labels.min() >= 0 and labels.max() < digits.k
        assert set(np.unique(labels)) == set(range(digits.k))


def test_metadata_accuracy_matches_test_rows(digits: ExampleData) -> None:
    accuracy = np.mean(np.argmax(digits.test_probs, axis=1) == digits.test_labels)
    assert digits.metadata["test_accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert digits.metadata["n_calib"] == len(digits.calib_labels)
    assert digits.metadata["n_test"] == len(digits.test_labels)
    for key in ("model", "seed", "source"):
        assert key in digits.metadata
    assert "digits" in digits.description


def test_file_is_small() -> None:
    for name in EXAMPLES:
        ref = resources.files("privcal.data").joinpath(f"{name}.npz")
        with resources.as_file(ref) as path:
            assert path.stat().st_size < 1_000_000


def test_unknown_name_is_a_clear_error() -> None:
    with pytest.raises(NotFound, match="unknown example"):
        load_example("mnist")


def test_loading_does_not_import_sklearn() -> None:
    # scikit-learn is a dev tool for scripts/ only; the runtime must not need it.
    code = "import sys, privcal.data as d; d.load_example(); print('sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
