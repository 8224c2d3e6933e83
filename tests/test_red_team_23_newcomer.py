"""Red team 23, newcomer: the human-facing outputs of the CLI.

- F1: ``evaluate`` printed a measured coverage rounded to nearest — 35 999 covered of 40 000
  (0.899975) read "coverage 0.9000 (guaranteed ≥ 0.9000)" above "below, but consistent with":
  a measured coverage is printed rounded down, a 95% upper bound rounded up.
- F4: ``budget show --subject 7.0`` (``Accountant.subject_spend``) answered "spent ε0=0" for an
  id no charge accepts, while the person charged as ``7`` had spent 2: the look-up applies the
  one id rule as the charges do.
- F2: ``release show`` of a Mondrian or several-level release printed the headline threshold
  alone; it prints each group's and level's n, threshold and bound, as ``calibrate`` does.
- F3: ``session open`` above a dataset's per-subject cap advised creating the dataset with a cap.
- F6: ``release list`` stated "coverage ≥ 0.9" of guarantees that hold with a probability
  (P-COQS, the local methods), and "(2, 0) local" of a label-only release.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

from privcal import Accountant
from privcal.cli import main


def _run(url: str, *args: str, code: int = 0) -> str:
    res = CliRunner().invoke(main, ["--db-url", url, *args])
    assert res.exit_code == code, (res.output, res.stderr)
    return res.output


def _probs(tmp_path: Path, covered: np.ndarray, k: int = 4) -> tuple[str, str]:
    """Probabilities whose label has p = 0.6 (score 0.4) where ``covered``, else p = 0.01
    (score 0.99), and their labels."""
    n = covered.size
    labels = np.arange(n) % k
    pl = np.where(covered, 0.6, 0.01)
    p = np.repeat(((1 - pl) / (k - 1))[:, None], k, axis=1)
    p[np.arange(n), labels] = pl
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", labels)
    return str(tmp_path / "p.npy"), str(tmp_path / "y.npy")


def test_a_measured_coverage_below_the_guarantee_is_not_printed_as_equal_to_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(url).create_dataset("d", rho=1, allow_nonprivate=True)
    # calibration: 90 % of the scores at 0.4, the rest at 0.99 → split's threshold is 0.4
    cal = np.ones(1000, dtype=bool)
    cal[:95] = False
    p, y = _probs(tmp_path, cal)
    _run(url, "calibrate", "split", "--dataset", "d", "--probs", p, "--labels", y,
         "--alpha", "0.1", "--score", "lac")
    assert Accountant(url).release(1).threshold == 1 - 0.6
    test = np.ones(40_000, dtype=bool)
    test[:4001] = False  # 35 999 of 40 000 covered: 0.899975
    p, y = _probs(tmp_path, test)
    out = _run(url, "evaluate", "--release", "1", "--probs", p, "--labels", y)
    assert "coverage            0.8999   (guaranteed ≥ 0.9000)" in out, out
    assert "0.9000   (guaranteed" not in out
    ev = Accountant(url).release(1).evaluate(np.load(p), np.load(y))
    assert ev.coverage == 0.899975 and not ev.meets_guarantee
    assert 0.9024 < ev.coverage_upper_95 < 0.90245  # printed rounded up, never down
    assert "95% upper bound 0.9025" in out, out


def test_a_subject_spend_look_up_refuses_an_integer_spelled_as_a_float(tmp_path: Path) -> None:
    """F4: ``budget show --subject 7.0`` printed "spent ε0=0" for subject 7, who spent 2 —
    an id no charge accepts, looked up as a person who never spent."""
    import pytest

    from privcal.errors import InvalidInput

    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("u", epsilon=1, subject_epsilon=6)
    acct.charge_subjects("u", 2, ["7"])
    assert "spent ε0=2" in _run(url, "budget", "show", "u", "--subject", "7")
    with pytest.raises(InvalidInput, match="integer written as a float"):
        acct.charge_subjects("u", 2, ["7.0"])
    with pytest.raises(InvalidInput, match="integer written as a float"):
        acct.subject_spend("u", "7.0")
    res = CliRunner().invoke(main, ["--db-url", url, "budget", "show", "u", "--subject", "7.0"])
    assert res.exit_code == 1 and "spent" not in res.stdout
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("error: ") and "integer written as a float" in res.stderr


def test_release_show_prints_every_group_and_level_threshold(tmp_path: Path) -> None:
    """F2: ``release show`` of a Mondrian release at two levels printed one threshold (the
    headline) and none of the six its groups and levels apply, which ``calibrate`` printed."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("c", rho=2)
    g = np.random.default_rng(0)
    probs = g.dirichlet(np.ones(3), size=3000)
    labels = np.array([g.choice(3, p=p) for p in probs])
    rel = acct.calibrate("pcoqs", dataset="c", probs=probs, labels=labels, score="lac",
                         alpha=[0.1, 0.2], rho=0.25, mondrian="label", public_groups=True)
    rows = rel.thresholds()
    assert len(rows) == 6 and len({r["threshold"] for r in rows}) == 6
    out = _run(url, "release", "show", str(rel.id))
    for r in rows:
        line = (f"group {r['group']} (n={r['n']})", f"α={r['alpha']:g}: threshold "
                f"{r['threshold']!r}, coverage ≥ {r['lower']:g}")
        assert any(line[0] in ln and line[1] in ln for ln in out.splitlines()), (line, out)
    # a plain release has no such rows
    plain = acct.calibrate("pcoqs", dataset="c", scores=g.random(500), alpha=0.1, rho=0.1)
    assert "group " not in _run(url, "release", "show", str(plain.id))


def test_a_session_over_the_per_subject_cap_is_told_the_cap_not_to_create_one(
    tmp_path: Path,
) -> None:
    """F3: ``session open`` with ε0 above the dataset's per-subject cap 3 said "the per-subject
    cap is 3 (create the dataset with --subject-epsilon)": the advice of a dataset without
    one."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("capped", epsilon=1, subject_epsilon=3)
    acct.create_dataset("uncapped", epsilon=1)
    base = ["session", "open", "ldp-score", "--alpha", "0.1", "--epsilon", "5", "--rounds", "3",
            "--group-size", "10", "--dataset"]
    res = CliRunner().invoke(main, ["--db-url", url, *base, "capped"])
    assert res.exit_code == 3, res.stderr
    assert "--subject-epsilon" not in res.stderr and "per-subject cap 3" in res.stderr
    assert "ε0 ≤ 3" in res.stderr
    res = CliRunner().invoke(main, ["--db-url", url, *base, "uncapped"])
    assert res.exit_code == 3 and "create the dataset with --subject-epsilon" in res.stderr
    assert acct.ledger.head().seq == 2  # the two datasets: nothing else written


def test_release_list_says_with_what_probability_and_of_what_a_release_holds(
    tmp_path: Path,
) -> None:
    """F6: ``release list`` printed "coverage ≥ 0.9" for a P-COQS release whose guarantee holds
    given an event of probability ≥ 0.95, and "(2, 0) local" for a label-only ldp-label
    release as for ldp-score's (x, y) claim."""
    import re

    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    acct.create_dataset("u", epsilon=1, subject_epsilon=6)
    g = np.random.default_rng(1)
    pc = acct.calibrate("pcoqs", dataset="d", scores=g.random(1000), alpha=0.1, rho=0.1)
    sp = acct.calibrate("split", dataset="d", scores=g.random(1000), alpha=0.1)
    ids = [f"u{i}" for i in range(400)]
    ll = acct.calibrate("ldp-label", dataset="u", probs=g.dirichlet(np.ones(3), 400),
                        labels=g.integers(0, 3, 400), subjects=ids, alpha=0.2, epsilon=2,
                        classes=["a", "b", "c"])
    ls = acct.calibrate("ldp-score", dataset="u", scores=g.random(400), subjects=ids,
                        alpha=0.2, epsilon=2)
    assert pc.coverage.failure_probability == 0.05 and sp.coverage.failure_probability == 0
    out = _run(url, "release", "list")
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^ (\d+) .*$", out, re.M)}
    assert " 0.9 w.p. ≥ 0.95 " in rows[pc.id]
    assert " 0.9 " in rows[sp.id] and "w.p." not in rows[sp.id]  # split: no failure event
    fail = ll.coverage.failure_probability
    assert fail > 0 and f" w.p. ≥ {1 - fail:g} " in rows[ll.id]
    assert "(2, 0) local, label only" in rows[ll.id]
    assert "(2, 0) local " in rows[ls.id] and "label only" not in rows[ls.id]
    assert "(2, 0) local, label only" in _run(url, "release", "show", str(ll.id))
