"""Red team 22, ledger F2: a ``subject_spend`` row edited so that its dataset's sum passes
2⁶³ − 1 made ``privcal audit verify`` on SQLite end in a raw SQLAlchemy traceback ("integer
overflow", exit 1) instead of failing verification (one line naming the dataset, exit 4)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.errors import AuditFailed


@pytest.mark.parametrize("units", [5 * 10**18, 2**63 - 1])
def test_a_spend_sum_past_64_bits_fails_verification_in_one_line(
        tmp_path: Path, units: int) -> None:
    path = tmp_path / "l.db"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.ledger.upgrade()
    acct.create_dataset("d", epsilon=10, subject_epsilon=5)
    acct.create_dataset("e", epsilon=10, subject_epsilon=5)
    acct.charge_subjects("e", 1, ["x"])
    acct.charge_subjects("d", 1, ["a", "b", "c"])
    acct.ledger.close()
    with sqlite3.connect(path) as c:
        c.execute("UPDATE subject_spend SET spent_units = ? WHERE dataset_id = 1 AND "
                  "rowid IN (SELECT rowid FROM subject_spend WHERE dataset_id = 1 LIMIT 2)",
                  (units,))
    with pytest.raises(AuditFailed, match=r"^dataset 1 \('d'\): per-subject spends add up to "
                       r"more than 2\*\*63 − 1 units \(rows edited\)$"):
        Accountant(Ledger(f"sqlite:///{path}")).verify()
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{path}", "audit", "verify"])
    assert res.exit_code == 4 and res.output.count("\n") == 1, res.output
    assert "per-subject spends add up to more than 2**63 − 1 units" in res.output


def test_the_charge_message_prints_the_amount_charged(tmp_path: Path) -> None:
    """Red team 22, newcomer F2: ``privcal charge --epsilon 5e-324`` printed ε with 323 zeros
    beside a stored ε = 1e-12 (amounts are charged rounded *up* to 12 decimal places); the
    message now prints the recorded cost, as ``--json`` does."""
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Accountant(url).create_dataset("d", epsilon=1)
    said = []
    for eps in ("5e-324", "0.12345678901234567", "0.5"):
        res = CliRunner().invoke(main, ["--db-url", url, "charge", "d", "--epsilon", eps])
        assert res.exit_code == 0, res.output
        said.append(res.output.split(" (pure DP)")[0])
    assert said == ["charged ε=0.000000000001", "charged ε=0.123456789013", "charged ε=0.5"]
    assert res.output.endswith("remaining epsilon=0.376543210986\n")  # 1 − the three charged


@pytest.mark.parametrize("command", [["audit", "verify"], ["db", "current"], ["db", "upgrade"],
                                     ["budget", "show", "d"]])
def test_a_branched_schema_history_is_one_line(tmp_path: Path, command: list[str]) -> None:
    """Red team 22, ledger F3: two rows in ``alembic_version`` (a branched history: no privcal
    writes one) made every command an Alembic traceback, exit 1; now the one line of an
    unknown revision, exit 5, nothing written."""
    path = tmp_path / "l.db"
    led = Ledger(f"sqlite:///{path}")
    led.upgrade()
    Accountant(led).create_dataset("d", rho=1)
    led.close()
    with sqlite3.connect(path) as c:
        c.execute("INSERT INTO alembic_version VALUES ('0010')")
    before = path.read_bytes()
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{path}", *command])
    assert res.exit_code == 5 and res.output.count("\n") == 1, res.output
    assert "is at several schema revisions at once ('0010', '00" in res.output
    assert "a newer privcal wrote it (upgrade privcal)" in res.output
    assert path.read_bytes() == before


@pytest.mark.parametrize(("notion", "column", "value"), [
    ("rho", "spent_zcdp_rho", "NaN"), ("epsilon", "spent_pure_eps", "NaN"),
    ("epsilon", "spent_pure_eps", "sNaN")])
def test_running_totals_that_are_not_numbers_refuse_the_charge_in_one_line(
        tmp_path: Path, notion: str, column: str, value: str) -> None:
    """Ledger F5: a dataset's running total set to NaN outside privcal made every later charge
    a decimal.InvalidOperation traceback; now one line, nothing written (``audit verify``
    names the edit)."""
    from privcal.costs import ZCDP, PureDP
    from privcal.errors import LedgerError

    path = tmp_path / "l.db"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.ledger.upgrade()
    acct.create_dataset("d", **{notion: 1})
    cost = ZCDP(rho="0.1") if notion == "rho" else PureDP(eps="0.1")
    acct.charge("d", cost)
    acct.ledger.close()
    with sqlite3.connect(path) as c:
        c.execute(f"UPDATE datasets SET {column} = ?", (value,))
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    head = acct.ledger.head()
    with pytest.raises(LedgerError, match=r"^dataset 'd': its running totals are not numbers "
                       r"\(a row edited outside privcal\?\): nothing was charged"):
        acct.charge("d", cost)
    assert acct.ledger.head() == head
    with pytest.raises(AuditFailed):
        acct.verify()
