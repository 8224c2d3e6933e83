"""Red team 18 (auditor, F9): ``audit verify`` did not check that a release's charges are
logged before it. privcal charges, then releases (the charge committed first); a log in which a
release's entry precedes a charge it names records a release made unpaid, with the charge
written afterwards — which a database administrator can produce by rewriting the log from
the release's entry on (no signing key needed, README: detected without a kept head only
if the rewritten log is itself inconsistent, which this check now makes it)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.errors import AuditFailed
from privcal.storage import audit
from tests.test_red_team_8_accounting import _rechain


def _entries(led: Any) -> list[tuple[int, str, str]]:
    with led.engine.connect() as conn:
        return [(int(s), k, p) for s, k, p in conn.execute(text(
            "SELECT seq, kind, payload FROM audit_log ORDER BY seq"))]


def test_a_release_logged_before_its_charge_fails_verify(ledger: Any) -> None:
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=1)
    rel = acct.calibrate("exponq", dataset="d", scores=np.linspace(0, 1, 50), alpha=0.1,
                         epsilon=0.5, score_range=(0, 1))
    assert acct.verify().releases == 1
    by_kind = {k: (s, p) for s, k, p in _entries(ledger)}
    (c_seq, c_doc), (r_seq, r_doc) = by_kind["charge"], by_kind["release"]
    assert c_seq + 1 == r_seq  # charged, then released, one after the other
    charge, release = json.loads(c_doc), json.loads(r_doc)
    assert release["data"]["charge_ids"] == [charge["data"]["charge_id"]] == [rel.charge_id]
    # the DBA swaps them: the release first, its charge after it, the chain recomputed
    charge["seq"], release["seq"] = r_seq, c_seq
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE audit_log SET kind = :k WHERE seq = :s"),
                     {"k": "release", "s": c_seq})
        conn.execute(text("UPDATE audit_log SET kind = :k WHERE seq = :s"),
                     {"k": "charge", "s": r_seq})
    _rechain(ledger, {c_seq: audit.canonical(release), r_seq: audit.canonical(charge)})
    with pytest.raises(AuditFailed, match=rf"audit entry {c_seq}: release 1: charge "
                                          rf"{rel.charge_id} is logged after it \(audit entry "
                                          rf"{r_seq}\); a release is paid for before it is "
                                          "recorded"):
        acct.verify()
