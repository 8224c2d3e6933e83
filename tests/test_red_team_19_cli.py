"""Red team 19 (newcomer): the CLI against a new user's natural mistakes.

- F1: a read-only command (``audit verify``, ``budget show``, ``release list``, ``serve``, …)
  on a SQLite file that does not exist created a new empty ledger, and ``audit verify``
  said "ok: 0 log entries verify" (a one-letter typo in an auditor's ``--db-url``). It now
  names the missing file, creates nothing, exits 1; writing commands still create one.
- F2: Ctrl-C after a run's charge printed click's "Aborted!" with exit 1, which the README
  says means "nothing changed", while the charge stayed. It now says what stays, exit 130.
- F3: ``?mode=ro`` without ``uri=true`` was ignored by the driver (a warning) and the
  ledger opened read-write: a query SQLite would ignore is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from privcal.cli import main


def _run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("command", [
    ["audit", "verify"], ["audit", "report"], ["audit", "head"], ["budget", "show", "d"],
    ["dataset", "list"], ["dataset", "show", "d"], ["release", "list"], ["release", "show", "1"],
    ["token", "list"], ["session", "status", "1"],
])
def test_a_read_only_command_makes_no_ledger(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "clnic.sqlite"
    res = _run("--db-url", f"sqlite:///{path}", *command)
    assert res.exit_code == 1, res.output
    assert f"error: no ledger at {path}: this command reads a ledger and makes none" in res.output
    assert not path.exists()
    doc = json.loads(_run("--json", "--db-url", f"sqlite:///{path}", *command).stdout)
    assert doc["error"]["type"] == "NotFound" and not path.exists()


def test_a_writing_command_still_makes_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    res = _run("--db-url", url, "audit", "verify")
    assert res.exit_code == 0 and "ok: 1 log entries verify" in res.output, res.output


def test_ctrl_c_after_the_charge_says_what_stays(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from privcal.calibrators.exponq import ExponQ

    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--epsilon", "1").exit_code == 0
    np.save(tmp_path / "s.npy", np.linspace(0, 1, 500))

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ExponQ, "calibrate", interrupted)  # Ctrl-C once the charge is in
    res = _run("--db-url", url, "calibrate", "exponq", "--dataset", "d", "--alpha", "0.1",
               "--epsilon", "0.5", "--scores", str(tmp_path / "s.npy"),
               "--score-range", "0,1")
    assert res.exit_code == 130, res.output
    assert "Aborted!" not in res.output
    assert "error: interrupted (Ctrl-C): what was committed before stays — a calibration's " \
           "charge is kept" in " ".join(res.output.split())
    shown = json.loads(_run("--json", "--db-url", url, "budget", "show", "d").stdout)
    assert shown["charges"] == 1 and shown["releases"] == 0, shown


def test_a_sqlite_query_the_driver_would_ignore_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    res = _run("--db-url", f"{url}?mode=ro", "charge", "d", "--rho", "0.01")
    assert res.exit_code == 1, res.output
    assert "mode" in res.output and "uri=true" in res.output
    shown = json.loads(_run("--json", "--db-url", url, "budget", "show", "d").stdout)
    assert shown["charges"] == 0


def test_another_applications_database_is_not_made_a_ledger(ledger_url: str) -> None:
    """F13: a database holding an application's tables and no privcal schema was "without a
    privcal schema … run `privcal db upgrade`" (exit 5), and `db upgrade` then wrote
    privcal's tables, its secret among them, beside the application's. Now it is named not
    a ledger (exit 1) and `db upgrade` refuses it unless --beside-other-tables."""
    from sqlalchemy import create_engine, inspect, text

    from privcal.storage import Ledger

    engine = create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE patients (id INTEGER, name TEXT)"))
    for command in (["audit", "verify"], ["db", "check"], ["db", "upgrade"],
                    ["dataset", "create", "d", "--rho", "1"]):
        res = _run("--db-url", ledger_url, *command)
        assert res.exit_code == 1, (command, res.output)
        assert "holds tables that are not privcal's (patients) and no privcal schema: not a " \
               "privcal ledger" in res.output, res.output
    with engine.connect() as conn:
        assert inspect(conn).get_table_names() == ["patients"]  # nothing written
    # an empty alembic_version (another Alembic application after `downgrade base`) is no
    # privcal revision: still not a ledger (the review of red team 19)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)"))
    res = _run("--db-url", ledger_url, "db", "upgrade")
    assert res.exit_code == 1 and "(patients)" in res.output, res.output
    res = _run("--db-url", ledger_url, "db", "upgrade", "--beside-other-tables")
    assert res.exit_code == 0, res.output
    led = Ledger(ledger_url)
    assert led.check() == led.head_revision()
    led.close()
    engine.dispose()


def test_a_head_of_another_ledger_is_not_called_a_rewrite(tmp_path: Path) -> None:
    """F10: a head kept from another ledger was "hash differs … (log rewritten)" of an
    intact log; the head itself cannot tell which ledger it is of, so both are said."""
    urls = [f"sqlite:///{tmp_path / f'{n}.sqlite'}" for n in ("a", "b")]
    for u, cap in zip(urls, ("1", "2"), strict=True):
        assert _run("--db-url", u, "dataset", "create", "d", "--rho", cap).exit_code == 0
    head_a = _run("--db-url", urls[0], "audit", "head").output.strip()
    res = _run("--db-url", urls[1], "audit", "verify", "--expect-head", head_a)
    assert res.exit_code == 4, res.output
    assert "audit entry 1: hash differs from the expected head (log rewritten, or the head " \
           "is another ledger's)" in res.output


def test_a_missing_key_file_is_said_missing(tmp_path: Path) -> None:
    """F11.2: `audit head --sign` with a key file that does not exist said "is not an
    unencrypted PEM private key" (the read error was taken for a parse error)."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    res = _run("--db-url", url, "audit", "head", "--sign", str(tmp_path / "nokey.key"))
    assert res.exit_code == 1
    assert f"cannot read the private key {tmp_path / 'nokey.key'}: No such file" in res.output


@pytest.mark.parametrize("method,given,said", [
    ("pcoqs", "--epsilon", "No such option: --epsilon (pcoqs takes --rho;"),
    ("exponq", "--rho", "No such option: --rho (exponq takes --epsilon;"),
    ("split", "--rho", "No such option: --rho (split is not private: it takes neither;"),
])
def test_another_methods_privacy_option_names_this_ones(method: str, given: str,
                                                       said: str) -> None:
    """F11.1: `calibrate pcoqs --epsilon` was "No such option … Did you mean '--json'?"."""
    res = _run("calibrate", method, given, "1")
    assert res.exit_code == 2 and said in res.output and "--json" not in res.output, res.output


def test_a_dry_run_says_when_the_run_can_only_release_the_trivial_set(tmp_path: Path) -> None:
    """F4: the dry run said "allowed yes (fits)" for a run whose shape already fixes its
    threshold at +inf (n = 300 < the 399 P-COQS needs at α = 0.1, ρ = 0.1); the run then
    charged ρ for the trivial set. It now says so — and not of a run that can do better."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    np.save(tmp_path / "s.npy", np.random.default_rng(0).random(300))
    args = ["--db-url", url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1",
            "--scores", str(tmp_path / "s.npy"), "--dry-run"]
    small = _run(*args, "--rho", "0.1")
    assert small.exit_code == 0, small.output
    assert "release     +inf only, whatever the data — target rank 310 exceeds n = 300" \
        in small.output
    doc = json.loads(_run(*args, "--rho", "0.1", "--json").stdout)
    assert doc["trivial"] is True and doc["allowed"] is True
    enough = json.loads(_run(*args, "--rho", "0.5", "--json").stdout)
    assert enough["trivial"] is False and "target rank 288 of n = 300" in enough["guarantee"]
    assert "+inf only" not in _run(*args, "--rho", "0.5").output


def test_an_empty_ledgers_report_says_so(tmp_path: Path) -> None:
    """F12.7: `audit report` of a ledger without datasets printed nothing at all."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "db", "upgrade").exit_code == 0
    res = _run("--db-url", url, "audit", "report")
    assert res.exit_code == 0 and res.output.startswith("no datasets in this ledger")
    assert json.loads(_run("--db-url", url, "--json", "audit", "report").stdout) == []


def _local(tmp_path: Path, n: int, k: int, seed: int) -> tuple[Any, np.ndarray, np.ndarray,
                                                                np.random.Generator]:
    """A ledger with a local-DP dataset "l", and n random probabilities and labels of k
    classes (and the generator, for more)."""
    from privcal import Accountant, Ledger

    acct = Accountant(Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}"))
    acct.create_dataset("l", epsilon=1000, subject_epsilon=1000)
    g = np.random.default_rng(seed)
    return acct, g.dirichlet(np.ones(k), size=n), g.integers(0, k, size=n), g


def test_a_local_dry_run_says_when_the_run_can_only_release_the_trivial_set(
        tmp_path: Path) -> None:
    """Review of F4: the local-DP runs record their target 1−α, not coverage 1, so the dry
    run's first `trivial` missed newcomer F4's own ldp-label example (3 000 users, k = 10,
    ε = 2: target 1.068), which charges every user ε0 for +inf; and a 5-user ldp-score."""
    from privcal.accountant.calibration import dry_run

    acct, probs, labels, g = _local(tmp_path, 3000, 10, 3)
    ids = [f"u{i}" for i in range(3000)]
    label = dry_run(acct, "ldp-label", {"alpha": 0.1, "epsilon": 2}, dataset="l", probs=probs,
                    labels=labels, subjects=ids)
    assert label.trivial and label.allowed
    wide = dry_run(acct, "ldp-label", {"alpha": 0.1, "epsilon": 8}, dataset="l", probs=probs,
                   labels=labels, subjects=ids)
    assert not wide.trivial
    real = acct.calibrate("ldp-label", dataset="l", alpha=0.1, epsilon=2, probs=probs,
                          labels=labels, subjects=ids)
    assert real.threshold == float("inf")  # as the dry run said
    few = dry_run(acct, "ldp-score", {"alpha": 0.1, "epsilon": 2}, dataset="l",
                  scores=g.random(5), subjects=ids[:5])
    assert few.trivial
    many = dry_run(acct, "ldp-score", {"alpha": 0.1, "epsilon": 2}, dataset="l",
                   scores=g.random(3000), subjects=ids)
    assert not many.trivial


def test_a_bare_sqlite_file_is_no_ledger_either(tmp_path: Path) -> None:
    """Review of F1: `db check` on a mistyped path made a 4 KiB SQLite file with no table,
    which read-only commands then took for a ledger (and migrated: "ok: 0 log entries");
    and a `file:` URI's missing file was never looked at."""
    import sqlite3

    path = tmp_path / "ledgr.sqlite"
    for command in (["db", "check"], ["db", "current"], ["audit", "verify"]):
        res = _run("--db-url", f"sqlite:///{path}", *command)
        assert res.exit_code == 1 and "no ledger at" in res.output, (command, res.output)
        assert not path.exists()
    sqlite3.connect(path).execute("PRAGMA user_version = 0").connection.close()
    sqlite3.connect(path).execute("VACUUM").connection.close()  # a bare database file
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("DROP TABLE t")  # a header and pages, no table
    assert path.stat().st_size > 0
    res = _run("--db-url", f"sqlite:///{path}", "audit", "verify")
    assert res.exit_code == 1 and f"no ledger at {path}" in res.output, res.output
    uri = tmp_path / "typo.sqlite"
    res = _run("--db-url", f"sqlite:///file:{uri}?uri=true", "audit", "verify")
    assert res.exit_code == 1 and f"no ledger at {uri}" in res.output, res.output
    assert not uri.exists()


def test_a_new_ledger_named_by_a_file_uri_is_private(tmp_path: Path) -> None:
    """Review of F1: a ledger made through a `file:` URI (which the README now recommends for
    read-only opens) was 0644 under umask 022 — the pseudonyms' secret readable by all."""
    import os

    path = tmp_path / "u.sqlite"
    old = os.umask(0o022)
    try:
        res = _run("--db-url", f"sqlite:///file:{path}?uri=true", "dataset", "create", "d",
                   "--rho", "1")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    assert path.stat().st_mode & 0o777 == 0o600
    ro = _run("--db-url", f"sqlite:///file:{path}?mode=ro&uri=true", "budget", "show", "d")
    assert ro.exit_code == 0, ro.output


def test_a_local_dry_run_counts_distinct_subjects(tmp_path: Path) -> None:
    """The review of red team 19: 4 000 rows of 200 subjects were priced and stated as
    n = 4 000 (not trivial), and the run, one row per subject, released +inf at n = 200."""
    from privcal.accountant.calibration import dry_run

    acct, probs, labels, _ = _local(tmp_path, 4000, 3, 4)
    ids = [f"s{i % 200}" for i in range(4000)]
    dr = dry_run(acct, "ldp-label", {"alpha": 0.1, "epsilon": 4}, dataset="l", probs=probs,
                 labels=labels, subjects=ids)
    assert dr.trivial, dr.guarantee
    rel = acct.calibrate("ldp-label", dataset="l", alpha=0.1, epsilon=4, probs=probs,
                         labels=labels, subjects=ids)
    assert rel.shape["n"] == 200 and rel.threshold == float("inf")
    assert dr.guarantee == rel.coverage.statement  # the statement the run records


def test_a_header_only_csv_and_a_file_that_is_not_npy_say_what_they_are(tmp_path: Path) -> None:
    """F11.3/F11.4: a CSV with a header and no row was "scores must be numeric, got dtype
    object" (no file, no reason); a file named .npy that is not one, or an object array,
    repeated numpy's advice to load it with allow_pickle — an unsafe load privcal never
    makes."""
    url = f"sqlite:///{tmp_path / 'l.sqlite'}"
    assert _run("--db-url", url, "dataset", "create", "d", "--rho", "1").exit_code == 0
    (tmp_path / "hdr.csv").write_text("score\n")
    (tmp_path / "bad.npy").write_text("garbage text here\n")
    np.save(tmp_path / "obj.npy", np.array(["a", None], dtype=object), allow_pickle=True)
    base = ["--db-url", url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.1",
            "--rho", "0.1", "--scores"]
    res = _run(*base, str(tmp_path / "hdr.csv"))
    assert res.exit_code == 1 and f"{tmp_path / 'hdr.csv'}: a header and no row" in res.output
    for name in ("bad.npy", "obj.npy"):
        res = _run(*base, str(tmp_path / name))
        assert res.exit_code == 1 and f"{name}: not a NumPy .npy file of numbers" in res.output
        assert "allow_pickle" not in res.output
    shown = json.loads(_run("--json", "--db-url", url, "budget", "show", "d").stdout)
    assert shown["charges"] == 0
