"""Red team 19 (coverage, F1): a printed coverage bound is never above the recorded one.

``evaluate`` printed the recorded lower bound rounded to nearest (``.4f``): 0.89996 as
"guaranteed ≥ 0.9000", 0.99996 as "≥ 1.0000" beside a measured 1.0000 judged below it; the
quickstart (``.3f``), the threshold rows of a levels or Mondrian release (``.6g``), the
shortfall verdict (``.4g``) and ``fed plan`` (``1 − α`` with ``g``, M with ``.10f``) too.
Every such figure is now rounded down (:func:`privcal.cli.output.at_least`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.cli.output import at_least


@pytest.mark.parametrize("x,spec,text", [
    (0.89996, ".4f", "0.8999"), (0.99996, ".4f", "0.9999"), (0.9, ".4f", "0.9000"),
    (0.89996, ".3f", "0.899"), (0.9999999, "g", "0.999999"), (0.3, ".6g", "0.3"),
    (0.9999997, ".6g", "0.999999"), (0.854962, ".4g", "0.8549"), (0.5, "g", "0.5"),
    (0.99999990134, ".10f", "0.9999999013"), (float("inf"), ".4f", "inf"),
])
def test_a_lower_bound_is_rounded_down(x: float, spec: str, text: str) -> None:
    assert at_least(x, spec) == text


def test_evaluate_prints_the_recorded_bound_rounded_down(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.sqlite"
    acct = Accountant(Ledger(url))
    acct.ledger.upgrade()
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    g = np.random.default_rng(0)
    n = 24999
    rel = acct.calibrate("split", dataset="d", preds=np.zeros(n), targets=g.uniform(size=n),
                         score="absolute", alpha=0.00004)
    assert rel.coverage.lower == 0.99996
    np.save(tmp_path / "p.npy", np.zeros(2000))
    np.save(tmp_path / "y.npy", g.uniform(size=2000))
    out = CliRunner().invoke(main, ["--db-url", url, "evaluate", "--release", str(rel.id),
                                    "--preds", str(tmp_path / "p.npy"),
                                    "--targets", str(tmp_path / "y.npy")])
    assert out.exit_code == 0, out.output
    assert "(guaranteed ≥ 0.9999)" in out.output, out.output


def test_fed_plan_states_one_minus_alpha_rounded_down() -> None:
    out = CliRunner().invoke(main, ["fed", "plan", "--agents", "10", "--local-n", "100000000",
                                    "--alpha", "0.0000001"])
    assert out.exit_code == 0, out.output
    assert "coverage ≥ 0.999999 (= M" in out.output and "coverage ≥ 1 " not in out.output
