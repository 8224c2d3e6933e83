"""Red team 20, service F2: a stored value of the wrong *form* — an amount 'sNaN', JSON that
is not, a non-ISO timestamp, text that is not UTF-8, a head seq that is text — made
``audit verify`` end in a traceback (exit 1) and ``POST /v1/audit/verify`` in a 500, where
any other edit is exit 4 / ``ok: false`` naming what failed: an auditor's script that tells
"tampered" from "tool broken" was told the tool broke."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.errors import AuditFailed

_TAMPERS = {
    "cap_snan": ("update datasets set cap_rho='sNaN'", "cannot read"),
    "cap_text": ("update datasets set cap_rho='abc'", "cannot read"),
    "charge_snan": ("update charges set rho='sNaN' where id=1", "cannot read"),
    "params_not_json": ("update releases set params='not json'", "cannot read"),
    "created_garbage": ("update datasets set created_at='garbage'", "cannot read"),
    "head_seq_text": ("update audit_head set seq='x'", "cannot read"),
    "payload_not_utf8": ("update audit_log set payload=CAST(X'FF' AS TEXT) where seq=2",
                         "not UTF-8"),
    "name_not_utf8": ("update datasets set name=CAST(X'FF' AS TEXT)", "not UTF-8"),
}


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("honest") / "l.sqlite"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.create_dataset("d", rho=1)
    acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1,
                   scores=np.random.default_rng(0).random(500))
    acct.ledger.close()
    return path


@pytest.mark.parametrize("name", sorted(_TAMPERS))
def test_a_value_of_the_wrong_form_is_an_audit_failure(honest: Path, tmp_path: Path,
                                                        name: str) -> None:
    sql, said = _TAMPERS[name]
    path = tmp_path / "l.sqlite"
    shutil.copy(honest, path)
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    url = f"sqlite:///{path}"
    acct = Accountant(Ledger(url))
    with pytest.raises(AuditFailed, match=said):
        acct.verify()
    acct.ledger.close()
    res = CliRunner().invoke(main, ["--db-url", url, "audit", "verify"])
    assert res.exit_code == 4 and said in res.output, res.output
    assert "Traceback" not in res.output


def test_the_honest_ledger_verifies(honest: Path) -> None:
    """The same ledger untouched: the check above is not of a ledger that never verifies."""
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{honest}", "audit", "verify"])
    assert res.exit_code == 0, res.output
