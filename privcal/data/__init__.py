"""Data: example data shipped inside the package (used by ``privcal quickstart`` and the
docs); reading the user's data files is :mod:`privcal.data.files`.

``digits``: softmax outputs of a small logistic regression on scikit-learn's
bundled handwritten-digits data (10 classes): 900 calibration rows and 500
held-out test rows. ``scripts/make_example_data.py`` regenerates it; the file's
``metadata`` says which model, seed and source produced it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from privcal.errors import NotFound

__all__ = ["EXAMPLES", "ExampleData", "load_example"]

#: names accepted by :func:`load_example`
EXAMPLES: tuple[str, ...] = ("digits",)


@dataclass(frozen=True)
class ExampleData:
    """One bundled example: calibration and test softmax outputs with their true labels."""

    name: str
    calib_probs: np.ndarray  # (n_calib, k) float64, rows sum to 1
    calib_labels: np.ndarray  # (n_calib,) int64 in [0, k)
    test_probs: np.ndarray  # (n_test, k) float64, rows sum to 1
    test_labels: np.ndarray  # (n_test,) int64 in [0, k)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Number of classes."""
        return int(self.calib_probs.shape[1])

    @property
    def description(self) -> str:
        """One line for people: what the data is and where it came from."""
        m = self.metadata
        return (
            f"{self.name}: {m.get('source', '?')}; model {m.get('model', '?')}; "
            f"{len(self.calib_labels)} calibration / {len(self.test_labels)} test rows, "
            f"k={self.k}, test accuracy {m.get('test_accuracy', float('nan')):.3f}"
        )


def load_example(name: str = "digits") -> ExampleData:
    """Load a bundled example by name (see :data:`EXAMPLES`).

    Read through ``importlib.resources`` so it works from a wheel or a zip, not
    only from a source checkout. Raises :class:`privcal.errors.NotFound` for an
    unknown name.
    """
    if name not in EXAMPLES:
        raise NotFound(f"unknown example {name!r}; available: {', '.join(EXAMPLES)}")
    ref = resources.files(__name__).joinpath(f"{name}.npz")
    with resources.as_file(ref) as path, np.load(path, allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    metadata: dict[str, Any] = json.loads(str(arrays["metadata"][0]))
    return ExampleData(
        name=name,
        calib_probs=np.asarray(arrays["calib_probs"], dtype=np.float64),
        calib_labels=np.asarray(arrays["calib_labels"], dtype=np.int64),
        test_probs=np.asarray(arrays["test_probs"], dtype=np.float64),
        test_labels=np.asarray(arrays["test_labels"], dtype=np.int64),
        metadata=metadata,
    )
