"""Generate ``privcal/data/digits.npz``, the example data behind ``privcal quickstart``.

The softmax outputs of a logistic regression on scikit-learn's bundled
``load_digits`` (1797 8×8 handwritten digits, 10 classes; UCI ML hand-written
digits, shipped inside scikit-learn, no download). The rows are shuffled with a
fixed seed and split into

- a training part (the rest, 397 rows), used only to fit the model, not saved;
- 900 calibration rows: ``calib_probs`` (900×10), ``calib_labels``;
- 500 test rows: ``test_probs`` (500×10), ``test_labels``.

The model is deliberately small (trained on few rows) so that the prediction
sets at α = 0.1 are not all singletons. scikit-learn is needed to run this
script only; privcal itself never imports it.

Run from the repository root::

    python scripts/make_example_data.py            # writes privcal/data/digits.npz
    python scripts/make_example_data.py --out X.npz
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import sklearn
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression

SEED = 20240611
N_CALIB = 900
N_TEST = 500
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "privcal" / "data" / "digits.npz"


def _normalise(probs: np.ndarray) -> np.ndarray:
    """Rows summing to 1 to float precision (privcal validates at 1e-6; predict_proba is close)."""
    probs = np.asarray(probs, dtype=np.float64)
    return probs / probs.sum(axis=1, keepdims=True)


def build(seed: int = SEED) -> dict[str, np.ndarray]:
    """Fit the model and return the arrays to save (deterministic for a given seed)."""
    digits = load_digits()
    x = digits.data.astype(np.float64) / 16.0  # pixel intensities are 0..16
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    calib_idx = order[:N_CALIB]
    test_idx = order[N_CALIB : N_CALIB + N_TEST]
    train_idx = order[N_CALIB + N_TEST :]

    # Strong regularisation (C = 0.05) keeps the softmax outputs uncertain
    # enough that conformal sets vary in size, which makes the example instructive.
    model = LogisticRegression(C=0.05, max_iter=5000, random_state=seed)
    model.fit(x[train_idx], y[train_idx])

    calib_probs = _normalise(model.predict_proba(x[calib_idx]))
    test_probs = _normalise(model.predict_proba(x[test_idx]))
    test_labels = y[test_idx]
    accuracy = float(np.mean(np.argmax(test_probs, axis=1) == test_labels))
    metadata = {
        "name": "digits",
        "source": "scikit-learn load_digits (UCI ML hand-written digits, 1797 images, 10 classes)",
        "model": f"LogisticRegression(C=0.05) on pixels/16, scikit-learn {sklearn.__version__}",
        "seed": seed,
        "n_train": len(train_idx),
        "n_calib": len(calib_idx),
        "n_test": len(test_idx),
        "k": 10,
        "test_accuracy": accuracy,
        "generated_by": "scripts/make_example_data.py",
    }
    return {
        "calib_probs": calib_probs,
        "calib_labels": y[calib_idx],
        "test_probs": test_probs,
        "test_labels": test_labels,
        # A unicode array (not an object array) so np.load needs no allow_pickle.
        "metadata": np.array([json.dumps(metadata, sort_keys=True)]),
    }


def main() -> None:
    """Parse arguments, build the arrays, write the compressed .npz, print a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    arrays = build(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    meta = json.loads(str(arrays["metadata"][0]))
    print(
        f"wrote {args.out} ({args.out.stat().st_size} bytes): "
        f"{meta['n_calib']} calibration + {meta['n_test']} test rows, "
        f"test accuracy {meta['test_accuracy']:.4f}"
    )


if __name__ == "__main__":
    main()
