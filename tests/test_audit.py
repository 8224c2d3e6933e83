"""The hash-chained audit log: a third party can recompute it; tampering is detected."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np
import pytest
import rfc8785
from sqlalchemy import text

from privcal.calibrators.base import CalibrationInput
from privcal.costs import ZCDP
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage import audit


def _sql(ledger: Any, stmt: str, **params: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(stmt), params)


def _populate(accountant: Any, fake_calibrator: Any) -> dict[str, Any]:
    """dataset (entry 1), 3 charges (2-4), a release + its charge (5-6), a +inf release (7-8)."""
    accountant.create_dataset("d", rho=1)
    for i in range(3):
        accountant.charge("d", ZCDP(rho=0.1), purpose=f"p{i}")
    cal = fake_calibrator(ZCDP(rho=0.05))
    data = CalibrationInput(scores=np.linspace(0, 1, 50))
    rel = accountant.run(cal, {"alpha": 0.1}, data, dataset="d")
    small = CalibrationInput(scores=np.array([0.1, 0.2, 0.3]))
    rel_inf = accountant.run(cal, {"alpha": 0.1}, small, dataset="d")
    assert math.isinf(rel_inf.threshold)
    return {"release": rel, "release_inf": rel_inf}


def test_independent_recomputation_of_the_chain(accountant: Any, fake_calibrator: Any) -> None:
    """Re-verify with nothing but hashlib and rfc8785, as the module docstring documents."""
    _populate(accountant, fake_calibrator)
    ledger = accountant.ledger
    with ledger.engine.connect() as conn:
        rows = conn.execute(text("SELECT seq, payload, prev_hash, entry_hash FROM audit_log "
                                 "ORDER BY seq")).all()
    prev = bytes(32)
    for i, (seq, payload, prev_hex, entry_hex) in enumerate(rows, start=1):
        assert seq == i and prev_hex == prev.hex()
        doc = json.loads(payload)
        assert rfc8785.dumps(doc).decode() == payload and doc["seq"] == seq
        leaf = hashlib.sha256(b"\x00" + payload.encode()).digest()
        prev = hashlib.sha256(b"\x01" + prev + leaf).digest()
        assert prev.hex() == entry_hex
    assert ledger.verify().head == f"{len(rows)}:{prev.hex()}" == str(ledger.head())
    # numbers that are not integers are decimal strings; +inf is "Infinity"
    release_docs = [json.loads(p)["data"] for _, p, _, _ in rows if '"kind":"release"' in p]
    assert release_docs[0]["params"]["alpha"] == "0.1"
    assert release_docs[1]["threshold"] == "Infinity"
    assert not any(isinstance(v, float) for v in _walk(json.loads(rows[-1][1])))


def _walk(o: Any) -> list[Any]:
    if isinstance(o, dict):
        return [x for v in o.values() for x in _walk(v)]
    if isinstance(o, list):
        return [x for v in o for x in _walk(v)]
    return [o]


def _release_seq(ledger: Any, release_id: int) -> int:
    with ledger.engine.connect() as conn:
        for seq, payload in conn.execute(text("SELECT seq, payload FROM audit_log WHERE "
                                              "kind = 'release' ORDER BY seq")):
            if json.loads(payload)["data"]["release_id"] == release_id:
                return int(seq)
    raise AssertionError("release entry not found")


def test_edited_threshold_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    rel = _populate(accountant, fake_calibrator)["release"]
    ledger = accountant.ledger
    seq = _release_seq(ledger, rel.id)
    _sql(ledger, "UPDATE releases SET threshold = '0.5' WHERE id = :i", i=rel.id)
    with pytest.raises(AuditFailed, match=rf"audit entry {seq}: release {rel.id} differs"):
        ledger.verify()


def test_edited_charge_amount_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    ledger = accountant.ledger
    _sql(ledger, "UPDATE charges SET rho = '0.01' WHERE id = 2")  # logged as entry 3
    with pytest.raises(AuditFailed, match=r"audit entry 3: charge 2 differs"):
        ledger.verify()


def test_edited_running_total_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    _sql(accountant.ledger, "UPDATE datasets SET spent_zcdp_rho = '0.1'")
    with pytest.raises(AuditFailed, match="spent totals do not equal"):
        accountant.ledger.verify()


def test_deleted_charge_row_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    _sql(accountant.ledger, "DELETE FROM charges WHERE id = 1")  # entry 2
    with pytest.raises(AuditFailed, match=r"audit entry 2: charge 1 is missing"):
        accountant.ledger.verify()


def test_deleted_log_entry_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    _sql(accountant.ledger, "DELETE FROM audit_log WHERE seq = 3")
    with pytest.raises(AuditFailed, match=r"audit entry 3 is missing"):
        accountant.ledger.verify()


def test_reordered_entries_are_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    ledger = accountant.ledger
    # swap entries 2 and 3 (payloads and hashes move together)
    _sql(ledger, "UPDATE audit_log SET seq = -1 WHERE seq = 2")
    _sql(ledger, "UPDATE audit_log SET seq = 2 WHERE seq = 3")
    _sql(ledger, "UPDATE audit_log SET seq = 3 WHERE seq = -1")
    with pytest.raises(AuditFailed, match=r"audit entry 2"):
        ledger.verify()


def test_inserted_row_without_entry_is_detected(accountant: Any, fake_calibrator: Any) -> None:
    _populate(accountant, fake_calibrator)
    _sql(accountant.ledger,
         "INSERT INTO charges (dataset_id, scope, notion, rho, created_at) "
         "VALUES (1, 'dataset', 'zcdp', '0.001', CURRENT_TIMESTAMP)")
    with pytest.raises(AuditFailed, match=r"charge \d+ has no audit entry"):
        accountant.ledger.verify()


def test_truncation_needs_the_expected_head(accountant: Any, fake_calibrator: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    accountant.charge("d", ZCDP(rho=0.2))
    ledger = accountant.ledger
    kept = str(ledger.head())
    assert kept.startswith("3:")
    # a careful attacker removes the last charge everywhere, totals and head included
    with ledger.engine.connect() as conn:
        prev = conn.execute(text("SELECT entry_hash FROM audit_log WHERE seq = 2")).scalar_one()
    _sql(ledger, "DELETE FROM audit_log WHERE seq = 3")
    _sql(ledger, "DELETE FROM charges WHERE id = 2")
    _sql(ledger, "UPDATE datasets SET spent_zcdp_rho = '0.1', charge_count = 1")
    _sql(ledger, "UPDATE audit_head SET seq = 2, entry_hash = :h", h=prev)
    assert ledger.verify().entries == 2  # internally consistent: only the kept head reveals it
    with pytest.raises(AuditFailed,
                       match=r"audit entry 3: missing.*entries removed, or the log rewritten"):
        ledger.verify(expect_head=kept)


def test_truncation_without_fixing_the_head_row_is_detected(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    _sql(accountant.ledger, "DELETE FROM audit_log WHERE seq = 2")
    with pytest.raises(AuditFailed, match=r"audit entry 2"):
        accountant.ledger.verify()


def test_rewritten_log_differs_from_expected_head(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    ledger = accountant.ledger
    seq, h = str(ledger.head()).split(":")
    fake = "f" * 64
    with pytest.raises(AuditFailed, match=rf"audit entry {seq}: hash differs"):
        ledger.verify(expect_head=f"{seq}:{fake}")
    assert ledger.verify(expect_head=f"{seq}:{h}").entries == 2
    # an older head still verifies: the log is append-only
    accountant.charge("d", ZCDP(rho=0.1))
    assert ledger.verify(expect_head=f"{seq}:{h}").entries == 3
    with pytest.raises(InvalidInput, match="SEQ:HASH"):
        ledger.verify(expect_head="garbage")


def test_edited_payload_is_detected(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1)
    accountant.charge("d", ZCDP(rho=0.1))
    ledger = accountant.ledger
    with ledger.engine.connect() as conn:
        payload = conn.execute(text("SELECT payload FROM audit_log WHERE seq = 2")).scalar_one()
    _sql(ledger, "UPDATE audit_log SET payload = :p WHERE seq = 2",
         p=payload.replace('"rho":"0.1"', '"rho":"0.01"'))
    with pytest.raises(AuditFailed, match=r"audit entry 2: hash does not match"):
        ledger.verify()


def test_no_subject_ids_in_the_log(accountant: Any) -> None:
    accountant.create_dataset("d", rho=1, subject_epsilon=2)
    accountant.charge_subjects("d", 1, ["alice-7781", "bob-9913"])
    with accountant.ledger.engine.connect() as conn:
        log = " ".join(conn.execute(text("SELECT payload FROM audit_log")).scalars())
    assert "alice" not in log and "bob" not in log
    assert '"subjects_accepted":2' in log and '"eps0":"1"' in log
    assert accountant.ledger.verify().entries == 2


def test_hash_helpers_match_the_documented_construction() -> None:
    payload = audit.entry_payload(1, "charge", {"x": 0.1, "t": math.inf, "n": 3})
    assert payload == '{"data":{"n":3,"t":"Infinity","x":"0.1"},"kind":"charge","seq":1}'
    leaf = hashlib.sha256(b"\x00" + payload.encode()).digest()
    want = hashlib.sha256(b"\x01" + bytes(32) + leaf).hexdigest()
    assert audit.chain_hash(audit.GENESIS, payload) == want


