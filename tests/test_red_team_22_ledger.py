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
