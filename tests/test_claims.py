"""What is recorded is true, and bad input never gets a traceback (issues 14.4, 16.2, 16.7).

- ids are strings end to end: 64-bit and zero-padded subject ids in a CSV keep one subject
  per id (they went through a float: 200 distinct ids became 101 subjects, ``000007``
  became ``7``);
- rows dropped from a calibration are counted by reason in the release and the CLI output;
- ``--dry-run`` checks the subjects file; a header-less CSV starting with a BOM keeps its
  first row;
- a local-DP request that is infeasible for the subjects actually accepted is refused
  inside the charge transaction: nothing is written (it used to charge, then raise);
- the CLI answers every malformed input with one ``error:`` line, never a traceback;
- ``audit verify`` says what happened to an edited ``audit_head`` row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select, update

from privcal import Accountant, Ledger
from privcal.calibrators.validation import check_scores
from privcal.data.files import load_array
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage.models import AuditHead, Base, Dataset
from tests.cli_env import CliEnv

N = 200


class Env(CliEnv):
    def state(self) -> tuple[Any, ...]:
        return _snapshot(Accountant(Ledger(self.url)))


def _snapshot(acct: Accountant) -> tuple[Any, ...]:
    with acct.ledger.read() as s:
        counts = tuple(s.scalar(select(func.count()).select_from(t))
                       for t in Base.metadata.sorted_tables)
        spent = tuple(s.execute(select(
            Dataset.name, Dataset.spent_zcdp_rho, Dataset.spent_pure_eps,
            Dataset.spent_approx_eps, Dataset.charge_count).order_by(Dataset.name)).all())
    return acct.ledger.head(), counts, spent


@pytest.fixture
def env(ledger_url: str, tmp_path: Path) -> Env:
    e = Env(ledger_url, tmp_path)
    assert e.run("db", "upgrade").exit_code == 0
    assert e.run("dataset", "create", "L", "--epsilon", "1", "--subject-epsilon", "3"
                 ).exit_code == 0
    rng = np.random.default_rng(14)
    np.save(tmp_path / "s.npy", rng.beta(2, 5, N))
    return e


def _write_ids(path: Path, ids: list[str], header: bool = True) -> None:
    path.write_text(("subject\n" if header else "") + "".join(f"{i}\n" for i in ids))


def test_64bit_and_zero_padded_ids_stay_distinct(env: Env) -> None:
    """Issue 14.4: 64-bit ids above 2⁵³ collide as floats, and 000007 must stay 000007."""
    rng = np.random.default_rng(64)
    big = [str(int(x)) for x in rng.integers(2**62, 2**63 - 1, N - 1, dtype=np.int64)]
    # adjacent 64-bit ids are equal as floats: 2**62 + 1 and 2**62 + 2 would merge
    big[0], big[1] = str(2**62 + 1), str(2**62 + 2)
    ids = ["000007", *big]
    assert len(set(ids)) == N
    _write_ids(env.dir / "ids.csv", ids)
    rel = env.json("calibrate", "ldp-score", "--dataset", "L", "--alpha", "0.2", "--epsilon",
                   "2", "--simulate", "--scores", env.f("s.npy"), "--subjects",
                   env.f("ids.csv"))["release"]  # fmt: skip
    assert rel["shape"]["n"] == N  # no row merged or dropped
    assert rel["diagnostics"]["dropped_rows"] == {"duplicate_subject": 0, "subject_over_cap": 0}
    summary = env.json("budget", "show", "L", "--subjects")["subject_summary"]
    assert summary["subjects"] == N
    assert env.json("budget", "show", "L", "--subject", "000007")["subject"]["spent"] == "2"
    assert env.json("budget", "show", "L", "--subject", "7")["subject"]["spent"] == "0"
    assert env.json("budget", "show", "L", "--subject", big[1])["subject"]["spent"] == "2"
    # the API keys the same person the same way (an int id is its decimal spelling)
    acct = Accountant(Ledger(env.url))
    assert acct.subject_spend("L", 2**62 + 2) == 2
    assert acct.subject_spend("L", np.int64(2**62 + 1)) == 2


def test_dropped_rows_are_counted_by_reason(env: Env) -> None:
    """Issue 14.4/15: duplicates and subjects past their cap are left out and counted (counts
    only, never ids) in the release's JSON and in the human output."""
    acct = Accountant(Ledger(env.url))
    acct.charge_subjects("L", 2, [f"s{i}" for i in range(20)])  # 1 of 3 left: over cap at 2
    ids = [f"s{i}" for i in range(N - 10)] + [f"s{i}" for i in range(100, 110)]
    _write_ids(env.dir / "ids.csv", ids)
    args = ["calibrate", "ldp-score", "--dataset", "L", "--alpha", "0.2", "--epsilon", "2",
            "--simulate", "--scores", env.f("s.npy"), "--subjects", env.f("ids.csv")]
    res = env.run(*args)
    assert res.exit_code == 0, res.stderr
    assert "rows dropped        10 duplicate subject, 20 subject past its cap" in res.stdout
    assert "s1" not in res.stdout.replace("s1 ", "")  # no id is printed
    rel = acct.releases("L")[-1]
    assert rel.diagnostics["dropped_rows"] == {"duplicate_subject": 10, "subject_over_cap": 20}
    assert rel.shape["n"] == N - 30


def test_dry_run_checks_the_subjects_file(env: Env) -> None:
    before = env.state()
    base = ["calibrate", "ldp-score", "--dataset", "L", "--alpha", "0.2", "--epsilon", "2",
            "--simulate", "--scores", env.f("s.npy"), "--dry-run", "--subjects"]
    _write_ids(env.dir / "short.csv", [f"u{i}" for i in range(N - 1)])
    np.save(env.dir / "float_ids.npy", np.arange(N, dtype=float))
    np.save(env.dir / "blank.npy", np.array(["u1", "", *[f"v{i}" for i in range(N - 2)]]))
    for spec, msg in ((env.f("short.csv"), f"of {N} ids"),
                      (env.f("float_ids.npy"), "not floats"),
                      (env.f("blank.npy"), "empty id")):
        res = env.run(*base, spec)
        assert res.exit_code == 1, (spec, res.stdout, res.stderr)
        assert res.stderr.strip().splitlines()[-1].startswith("error: ") and msg in res.stderr
    _write_ids(env.dir / "ok.csv", [f"u{i}" for i in range(N)])
    assert env.run(*base, env.f("ok.csv")).exit_code == 0
    assert env.state() == before


def test_headerless_csv_with_a_bom_keeps_its_first_row(tmp_path: Path) -> None:
    (tmp_path / "s.csv").write_bytes("\ufeff0.25\n0.5\n0.75\n".encode())
    np.testing.assert_array_equal(load_array(str(tmp_path / "s.csv"), "scores"),
                                  [0.25, 0.5, 0.75])
    (tmp_path / "ids.csv").write_bytes("\ufeff000007\n000008\n".encode())
    assert load_array(str(tmp_path / "ids.csv"), "subjects", ids=True).tolist() == [
        "000007", "000008"]
    (tmp_path / "u.csv").write_text("s\n1_0\n2\n0.5\n")  # Python's float("1_0") is 10: not a score
    with pytest.raises(InvalidInput, match="numeric"):
        check_scores(load_array(str(tmp_path / "u.csv"), "scores"))


def test_infeasible_for_the_accepted_subjects_is_refused_before_anything_is_written(
    env: Env,
) -> None:
    """Issue 16.2: with most subjects at their cap, ldp-score with T = 8 rounds has too few
    accepted subjects; the check runs inside the charge transaction and rolls it back."""
    acct = Accountant(Ledger(env.url))
    acct.charge_subjects("L", 2, [str(i) for i in range(N - 5)])
    before = _snapshot(acct)
    scores = np.load(env.f("s.npy"))
    with pytest.raises(InvalidInput, match="8 rounds"):
        acct.calibrate("ldp-score", dataset="L", scores=scores, alpha=0.2, epsilon=2, rounds=8,
                       subjects=np.arange(N))
    assert _snapshot(acct) == before
    np.save(env.dir / "ids.npy", np.arange(N))
    res = env.run("calibrate", "ldp-score", "--dataset", "L", "--alpha", "0.2", "--epsilon",
                  "2", "--rounds", "8", "--simulate", "--scores", env.f("s.npy"),
                  "--subjects", env.f("ids.npy"))  # fmt: skip
    assert res.exit_code == 1 and "8 rounds" in res.stderr
    assert _snapshot(acct) == before


def _cli_cases(env: Env) -> dict[str, list[str]]:
    d = env.dir
    np.save(d / "empty.npy", np.zeros(0))
    np.save(d / "scalar.npy", np.float64(0.3))
    np.save(d / "p3.npy", np.full((4, 3), 1 / 3))
    np.save(d / "p5.npy", np.full((4, 5), 0.2))
    (d / "adir.npy").mkdir()
    pc = ["calibrate", "pcoqs", "--dataset", "Z", "--alpha", "0.1", "--rho", "0.01"]
    return {
        "rho 1e16": ["charge", "Z", "--rho", "1e16"],
        "rho 1_0": ["charge", "Z", "--rho", "0.0_1"],  # Decimal("0.0_1") is 0.01
        "dataset rho 1_0": ["dataset", "create", "U", "--rho", "1_0"],
        "release id 2**63": ["release", "show", str(2**63)],
        "release id 2**70 predict": ["predict", "--release", str(2**70), "--probs",
                                     str(d / "p3.npy")],
        "out into a missing directory": ["predict", "--release", "1", "--probs",
                                         str(d / "p3.npy"), "--out", str(d / "nodir" / "x.npy")],
        "out is a directory": ["predict", "--release", "1", "--probs", str(d / "p3.npy"),
                               "--out", str(d / "adir.npy")],
        "probabilities with another k": ["predict", "--release", "1", "--probs",
                                         str(d / "p5.npy")],
        "zero-length npy dry run": [*pc, "--scores", str(d / "empty.npy"), "--dry-run"],
        "scalar npy dry run": [*pc, "--scores", str(d / "scalar.npy"), "--dry-run"],
        "zero-length npy": [*pc, "--scores", str(d / "empty.npy")],
        "scalar npy": [*pc, "--scores", str(d / "scalar.npy")],
        "lone surrogate name": ["dataset", "create", "\ud800", "--rho", "1"],
        "NUL in name": ["dataset", "create", "a\x00b", "--rho", "1"],
        "lone surrogate lookup": ["budget", "show", "\ud800"],
        "surrogate purpose": ["charge", "Z", "--rho", "0.1", "--purpose", "\udcff"],
        "npy is a directory": [*pc, "--scores", str(d / "adir.npy")],
    }


CLI_CASES = ["rho 1e16", "rho 1_0", "dataset rho 1_0", "release id 2**63",
             "release id 2**70 predict", "out into a missing directory", "out is a directory",
             "probabilities with another k", "zero-length npy dry run", "scalar npy dry run",
             "zero-length npy", "scalar npy", "lone surrogate name", "NUL in name",
             "lone surrogate lookup", "surrogate purpose", "npy is a directory"]


@pytest.fixture
def cli_env(env: Env) -> Env:
    assert env.run("dataset", "create", "Z", "--rho", "1").exit_code == 0
    rng = np.random.default_rng(3)
    np.save(env.dir / "cp.npy", rng.dirichlet(np.ones(3), 300))
    np.save(env.dir / "cy.npy", rng.integers(0, 3, 300))
    rel = env.json("calibrate", "pcoqs", "--dataset", "Z", "--alpha", "0.1", "--rho", "0.01",
                   "--probs", env.f("cp.npy"), "--labels", env.f("cy.npy"),
                   "--score", "lac")["release"]  # fmt: skip
    assert rel["id"] == 1 and rel["shape"]["k"] == 3  # the release records k
    return env


@pytest.mark.parametrize("case", CLI_CASES)
def test_cli_bad_input_is_one_error_line_and_changes_nothing(cli_env: Env, case: str) -> None:
    """Issue 16.7: each of these raised a traceback (``catch_exceptions=False`` lets one
    through and fails the test)."""
    args = _cli_cases(cli_env)[case]
    before = cli_env.state()
    res = cli_env.run(*args)
    assert res.exit_code in (1, 2, 3), (case, res.exit_code, res.stderr)
    assert "Traceback" not in res.output + res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.lower().startswith("error: "), (case, res.stderr)
    assert cli_env.state() == before


def test_verify_says_what_happened_to_an_edited_head_row(env: Env) -> None:
    """Issue 16.7: an edited audit_head row was reported as "log truncated"."""
    acct = Accountant(Ledger(env.url))
    acct.verify()
    with acct.ledger.engine.begin() as conn:
        conn.execute(update(AuditHead).values(entry_hash="f" * 64))
    with pytest.raises(AuditFailed, match="head row was edited") as err:
        acct.verify()
    assert "truncated" not in str(err.value)
    last = acct.ledger.head()
    with acct.ledger.engine.begin() as conn:
        conn.execute(update(AuditHead).values(seq=last.seq - 1, entry_hash=last.entry_hash))
    with pytest.raises(AuditFailed, match="seq was edited"):
        acct.verify()
