"""Red team 22 on the CLI's human output and options.

- ui F6: thresholds were printed in 10 significant digits rounded to nearest — a recorded
  0.30000000000000004 printed "0.3", and sets built from the printed value covered 0.50
  under a recorded ≥ 0.9. ui F7: ``predict`` printed intervals in 6 digits
  (``[1.70005e+09, 1.70005e+09]`` for Unix times). Both print the number exactly now.
- newcomer F3: an option given twice took its last value — ``charge --dataset d --dataset
  L`` charged L. A usage error now, nothing charged.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Accountant
from privcal.cli import main


def _run(url: str, *args: str) -> str:
    res = CliRunner().invoke(main, ["--db-url", url, *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_a_threshold_is_printed_exactly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(url).create_dataset("d", rho=1, allow_nonprivate=True)
    p = np.array([0.9, 0.7, 0.2])[np.random.default_rng(0).choice(3, 1000, p=[.5, .45, .05])]
    np.save(tmp_path / "p.npy", np.stack([p, 1 - p], axis=1))
    np.save(tmp_path / "y.npy", np.zeros(1000, dtype=int))
    out = _run(url, "calibrate", "split", "--dataset", "d", "--probs", str(tmp_path / "p.npy"),
               "--labels", str(tmp_path / "y.npy"), "--alpha", "0.1", "--score", "lac")
    t = Accountant(url).release(1).threshold
    assert t == 1 - 0.7 == 0.30000000000000004  # the tie the printed 0.3 left out
    assert f"threshold           {t!r}" in out
    assert f" {t!r} " in _run(url, "release", "list")
    assert re.search(rf"threshold +{re.escape(repr(t))}\n", _run(url, "release", "show", "1"))
    assert f" {t!r} " in _run(url, "audit", "report")


def test_predicted_intervals_are_printed_exactly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(url).create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(1)
    f = 1_700_000_000 + g.random(500) * 100_000  # Unix times
    np.save(tmp_path / "f.npy", f)
    np.save(tmp_path / "y.npy", f + g.normal(0, 20, 500))
    _run(url, "calibrate", "split", "--dataset", "d", "--preds", str(tmp_path / "f.npy"),
         "--targets", str(tmp_path / "y.npy"), "--alpha", "0.1", "--score", "absolute")
    out = _run(url, "predict", "--release", "1", "--preds", str(tmp_path / "f.npy"))
    lo, hi = Accountant(url).release(1).predict_interval(f)[0]
    assert out.splitlines()[0] == f"0\t[{float(lo)!r}, {float(hi)!r}]"


@pytest.mark.parametrize(("args", "option"), [
    (["charge", "--dataset", "d", "--dataset", "e", "--epsilon", "0.01"], "--dataset"),
    (["charge", "d", "--epsilon", "0.01", "--epsilon", "0.02"], "--epsilon"),
    (["charge", "d", "--epsilon", "0.01", "--purpose", "a", "--purpose", "a"], "--purpose"),
])
def test_an_option_given_twice_is_a_usage_error(tmp_path: Path, args: list[str],
                                                option: str) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("d", epsilon=1)
    acct.create_dataset("e", epsilon=1)
    head = acct.ledger.head()
    res = CliRunner().invoke(main, ["--db-url", url, *args])
    assert res.exit_code == 2, res.output
    assert f"Error: {option} is given more than once: give it once" in res.output
    assert " charge --help' for help." in res.output  # the command's own usage
    assert acct.ledger.head() == head
    # flags, several-valued options and one --db-url twice may repeat
    _run(url, "--json", "charge", "d", "--epsilon", "0.01", "--json", "--db-url", url)


def test_a_parameter_given_twice_to_the_python_api_is_refused(tmp_path: Path) -> None:
    """Newcomer F3 in Python: ``calibrate("pcoqs", {"alpha": 0.1}, alpha=0.2)`` ran at 0.2."""
    from privcal.errors import InvalidInput

    acct = Accountant(f"sqlite:///{tmp_path / 'l.db'}")
    acct.create_dataset("d", rho=1)
    s = np.random.default_rng(0).random(200)
    with pytest.raises(InvalidInput, match=r"^alpha given both in params and as a keyword"):
        acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="d", scores=s, alpha=0.2)
    assert acct.budget("d").charges == 0
    acct.calibrate("pcoqs", {"alpha": 0.1}, dataset="d", scores=s, rho=0.1)
