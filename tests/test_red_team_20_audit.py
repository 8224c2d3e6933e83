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

#: name → (the edit, what the failure says, the row it names: the review's F10 — "the log or
#: its rows" sent an auditor looking through every table)
_TAMPERS = {
    "cap_snan": ("update datasets set cap_rho='sNaN'", "cannot read",
                 "audit entry 1 or the dataset row it logs"),
    "cap_text": ("update datasets set cap_rho='abc'", "cannot read", "datasets row 1"),
    "charge_snan": ("update charges set rho='sNaN' where id=1", "cannot read",
                    "or the charge row it logs"),
    "params_not_json": ("update releases set params='not json'", "cannot read",
                        "releases row 1"),
    "created_garbage": ("update datasets set created_at='garbage'", "cannot read",
                        "datasets row 1"),
    "head_seq_text": ("update audit_head set seq='x'", "cannot read", "the audit head row"),
    "payload_not_utf8": ("update audit_log set payload=CAST(X'FF' AS TEXT) where seq=2",
                         "not UTF-8", "audit entry 2"),
    "name_not_utf8": ("update datasets set name=CAST(X'FF' AS TEXT)", "not UTF-8",
                      "datasets row 1"),
    # the review: JSON nested past Python's recursion limit (a RecursionError)
    "params_deep": (f"update releases set params='{'[' * 100_000}{']' * 100_000}'",
                    "cannot read", "releases row 1"),
    "payload_deep": (f"update audit_log set payload='{'[' * 100_000}{']' * 100_000}' "
                     "where seq=2", "payload is not canonical JSON", "audit entry 2"),
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
    sql, said, where = _TAMPERS[name]
    path = tmp_path / "l.sqlite"
    shutil.copy(honest, path)
    with sqlite3.connect(path) as conn:
        conn.execute(sql)
    url = f"sqlite:///{path}"
    acct = Accountant(Ledger(url))
    with pytest.raises(AuditFailed, match=said) as got:
        acct.verify()
    assert where in str(got.value) and "the log or its rows" not in str(got.value), got.value
    acct.ledger.close()
    res = CliRunner().invoke(main, ["--db-url", url, "audit", "verify"])
    assert res.exit_code == 4 and said in res.output and where in res.output, res.output
    assert "Traceback" not in res.output


def test_the_honest_ledger_verifies(honest: Path) -> None:
    """The same ledger untouched: the check above is not of a ledger that never verifies."""
    res = CliRunner().invoke(main, ["--db-url", f"sqlite:///{honest}", "audit", "verify"])
    assert res.exit_code == 0, res.output


def test_a_wrong_key_or_head_is_the_callers_error_not_an_edited_row(honest: Path,
                                                                     tmp_path: Path) -> None:
    """The review of red team 20: with the stored-value check around the whole verify, a
    caller who passed the private key (or an RSA key, or 5) as the trusted key was told the
    honest ledger had "a row edited outside privcal"; it is a one-line InvalidInput."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from privcal.accountant.verification import sign_head
    from privcal.errors import InvalidInput
    from privcal.storage.signing import generate_keypair

    acct = Accountant(Ledger(f"sqlite:///{honest}"))
    priv, pub, _ = generate_keypair(tmp_path / "k.key", None)
    head = sign_head(acct, priv)
    assert acct.verify(signed_head=head, trusted_key=pub).entries >= 1
    private = serialization.load_pem_private_key(priv.read_bytes(), None)
    wrong = [private, rsa.generate_private_key(public_exponent=65537,
                                               key_size=2048).public_key(), 5, b"junk"]
    for key in wrong:
        with pytest.raises(InvalidInput, match="the trusted key must be an Ed25519 public"):
            acct.verify(signed_head=head, trusted_key=key)
    with pytest.raises(InvalidInput, match="is not a PEM public key"):  # the private file
        acct.verify(signed_head=head, trusted_key=priv)
    with pytest.raises(InvalidInput, match="a signed head is a file, its document"):
        acct.verify(signed_head=5, trusted_key=pub)
    acct.ledger.close()


def test_the_row_is_found_among_many(tmp_path: Path) -> None:
    """``first_unreadable`` halves a failing chunk down to its row: among 9 releases, the one
    edited is named, whatever the chunk size; an unedited ledger names none."""
    from privcal.storage.models import ReleaseRow
    from privcal.storage.unreadable import first_unreadable

    path = tmp_path / "l.sqlite"
    acct = Accountant(Ledger(f"sqlite:///{path}"))
    acct.create_dataset("d", rho=10)
    for _ in range(9):
        acct.calibrate("pcoqs", dataset="d", alpha=0.1, rho=0.1,
                       scores=np.random.default_rng(0).random(200))
    led = acct.ledger
    assert led.first_unreadable() is None
    led.close()
    with sqlite3.connect(path) as conn:
        conn.execute("update releases set params='{' where id=7")
    for chunk in (1, 2, 3, 4, 1024):
        assert first_unreadable(led.read, [ReleaseRow], chunk=chunk) == "releases row 7"
    assert led.first_unreadable() == "releases row 7"
    led.close()
