"""`audit verify` checks each entry by its kind's verifier (privcal.storage.verify.ENTRY_CHECKS):
every kind privcal writes has one, and an entry of a kind without one fails verification."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from privcal.costs import ZCDP
from privcal.errors import AuditFailed
from privcal.storage import verify

SOURCE = Path(verify.__file__).resolve().parents[1]
#: the kind argument of every entry privcal writes: append_audit(tx, "KIND", …) and the
#: migrations' entry_payload(seq, "KIND", …)
WRITES = re.compile(r"(?:append_audit|entry_payload)\(\s*\w+,\s*\"(?P<kind>\w+)\"")


def written_kinds() -> set[str]:
    return {m.group("kind") for path in SOURCE.rglob("*.py")
            for m in WRITES.finditer(path.read_text())}


def test_every_kind_privcal_writes_has_a_verifier() -> None:
    kinds = written_kinds()
    # the scan finds the writers (a sanity check of the pattern itself)
    assert {"dataset", "charge", "release", "session_open", "session_batch", "session_close",
            "migration"} <= kinds
    assert kinds <= set(verify.ENTRY_CHECKS), kinds - set(verify.ENTRY_CHECKS)


def test_an_entry_of_a_new_kind_without_a_verifier_fails(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)  # entry 1
    ledger = accountant.ledger
    ledger.write(lambda s: ledger.append_audit(s, "widget", {"widget_id": 1}))  # a valid link
    with pytest.raises(AuditFailed, match=r"audit entry 2: unknown kind 'widget' \(no verifier"):
        ledger.verify()


def test_the_table_decides(accountant: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing a kind's verifier makes its entries fail: the table is what is consulted."""
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(0.1), purpose="p")  # entry 2
    accountant.ledger.verify()
    monkeypatch.setattr(verify, "ENTRY_CHECKS",
                        {k: v for k, v in verify.ENTRY_CHECKS.items() if k != "charge"})
    with pytest.raises(AuditFailed, match=r"audit entry 2: unknown kind 'charge'"):
        accountant.ledger.verify()
