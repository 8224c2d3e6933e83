"""Red team 13 (mutation audit of tamper evidence): verification code no test pinned down.

Each test kills a mutant of the verification code that the suite let through; each tampers
with a ledger made through the public API as a database administrator could (SQL only, no
signing key), within what README "Signed heads: what a database administrator can and
cannot do" claims is detected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from privcal.costs import ZCDP
from privcal.errors import AuditFailed
from privcal.storage import audit, signing
from tests.test_migration_0005 import landed_ledger
from tests.test_red_team_8_accounting import _rechain


def _sql(led: Any, stmt: str, **params: Any) -> None:
    with led.engine.begin() as conn:
        conn.execute(text(stmt), params)


def test_a_rewritten_log_fails_a_signed_head_of_the_same_length(accountant: Any,
                                                                tmp_path: Path) -> None:
    """Mutant V36 (verify.py: the signed head's (seq, hash) not compared with the log): a DBA
    lowers charge 2 from ρ 0.5 to 0.1 in its row, its entry and the dataset's total, and
    recomputes every hash. The log is as long as when the head was signed, so only the
    signed hash can tell; README: "rewrites the log and recomputes every hash — with a
    signed head: detected"."""
    acct = accountant
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP("0.1"))
    acct.charge("d", ZCDP("0.5"))
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    signed = acct.ledger.sign_head(priv)
    assert acct.verify(signed_head=signed, trusted_key=pub).signed_through == 3
    led = acct.ledger
    with led.engine.connect() as conn:
        seq, payload = conn.execute(text(
            "SELECT seq, payload FROM audit_log WHERE kind = 'charge' ORDER BY seq DESC")).first()
    doc = json.loads(payload)
    assert doc["data"]["rho"] == "0.5"
    doc["data"]["rho"] = "0.1"
    _sql(led, "UPDATE charges SET rho = 0.1 WHERE id = :i", i=doc["data"]["charge_id"])
    _sql(led, "UPDATE datasets SET spent_zcdp_rho = 0.2 WHERE name = 'd'")
    _rechain(led, {int(seq): audit.canonical(doc)})
    acct.verify()  # without a head the rewrite passes (README: detected only with a head)
    with pytest.raises(AuditFailed, match=r"audit entry 3: hash differs from the signed head"):
        acct.verify(signed_head=signed, trusted_key=pub)
    with pytest.raises(AuditFailed, match=r"hash differs from the signed head"):
        acct.verify(signed_head=signed, trusted_key=pub, allow_unsigned_tail=True)


def test_a_forged_migration_entry_cannot_move_per_subject_units(accountant: Any) -> None:
    """F1 (real code): a DBA moves 0.5 of alice's local-DP spend to carol (subject_spend),
    inserts a matching subject_baseline (alice −0.5, carol +0.5) and appends a `migration`
    entry committing it, with a valid chain. The ledger was never migrated from schema ≤ 0004,
    its log already holds charges that record their members, and a baseline unit is never
    negative: verify must fail. README: "moves units — detected" (without a signed head).
    Fixed: a migration entry after an entry only 0005+ code writes is refused (verify.py),
    and so is a negative baseline (verify_subjects.py; tests/test_migration_0005.py)."""
    from decimal import Decimal

    from privcal.storage import pseudonyms
    from privcal.storage.models import spend_units

    acct = accountant
    acct.create_dataset("d", rho=1, subject_epsilon=1)
    acct.charge_subjects("d", "1", ["alice", "bob"])
    acct.charge_subjects("d", "0.5", ["carol"])
    acct.verify()
    led = acct.ledger
    with led.engine.begin() as conn:
        key = bytes.fromhex(conn.execute(text("SELECT secret FROM ledger_secret")).scalar_one())
        ds = conn.execute(text("SELECT id FROM datasets WHERE name = 'd'")).scalar_one()
        alice, carol = (pseudonyms.pseudonym(key, s) for s in ("alice", "carol"))
        u = spend_units(Decimal("0.5"))
        baseline = [(alice, -u), (carol, u)]
        for s, units in baseline:
            conn.execute(text("INSERT INTO subject_baseline (dataset_id, subject, spent_units) "
                              "VALUES (:d, :s, :u)"), {"d": ds, "s": s, "u": units})
            conn.execute(text("UPDATE subject_spend SET spent_units = spent_units + :u "
                              "WHERE dataset_id = :d AND subject = :s"),
                         {"u": units, "d": ds, "s": s})
        seq = conn.execute(text("SELECT seq FROM audit_head")).scalar_one()
    _rechain(led, {}, append=("migration", audit.entry_payload(seq + 1, "migration", {
        "revision": "0005", "subject_key": pseudonyms.key_id(key), "sessions": {},
        "subject_spend": {str(ds): {"subjects": 2,
                                    "digest": pseudonyms.spend_digest(baseline)}}})))
    assert acct.subject_spend("d", "alice") == Decimal("0.5")  # alice could spend 0.5 again
    with pytest.raises(AuditFailed, match=r"audit entry 4: a migration entry after entry 2, "
                                          r"which only privcal 0005 or later writes"):
        acct.verify()


def test_a_signed_head_s_time_and_format_are_covered(accountant: Any, tmp_path: Path) -> None:
    """Mutants S03 (signing.py: the time left out of the signed message) and S01 (the format
    not checked): a head file whose time was moved (to pass a stale head off as a recent one)
    or whose format was changed fails; the genuine one verifies."""
    acct = accountant
    acct.create_dataset("d", rho=1)
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    signed = acct.ledger.sign_head(priv)
    acct.verify(signed_head=signed, trusted_key=pub)
    doc = signed.model_dump()
    with pytest.raises(AuditFailed, match="does not verify with the trusted key"):
        acct.verify(signed_head={**doc, "time": "2099-01-01T00:00:00.000000Z"}, trusted_key=pub)
    with pytest.raises(AuditFailed, match="unknown format"):
        acct.verify(signed_head={**doc, "format": "privcal-signed-head-v0"}, trusted_key=pub)


def test_the_head_row_and_an_expected_genesis_head_are_checked(accountant: Any) -> None:
    """Mutants V03 (verify.py: a head row whose seq is below the log's last entry accepted)
    and V22 (an expected head "0:HASH" accepted with any HASH): the head row moved back to
    entry 1 with entry 2's hash kept fails; "0:" + a hash other than the genesis fails."""
    acct = accountant
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP("0.1"))
    led = acct.ledger
    led.verify(expect_head=f"0:{audit.GENESIS}")
    with pytest.raises(AuditFailed, match="the genesis hash"):
        led.verify(expect_head="0:" + "ab" * 32)
    _sql(led, "UPDATE audit_head SET seq = 1")
    with pytest.raises(AuditFailed, match="the head row's seq was edited"):
        led.verify()


_DATASET_EDITS = {  # column → (the dataset's policy, the DBA's edit)
    "cap_epsilon": ({"epsilon": 1}, "cap_epsilon = 100"),
    "cap_rho": ({"rho": 1}, "cap_rho = 100"),
    "cap_delta": ({"approx_epsilon": 1, "approx_delta": "1e-6"}, "cap_delta = 0.5"),
    "reporting_delta": ({"rho": 1}, "reporting_delta = 0.5"),
    "subject_epsilon": ({"rho": 1, "subject_epsilon": 1}, "subject_epsilon = 100"),
    "allow_nonprivate": ({"rho": 1}, "allow_nonprivate = TRUE"),
    "notion": ({"rho": 1}, "notion = 'approx'"),
    "renyi_orders": ({"approx_epsilon": 1, "approx_delta": "1e-6"},
                     """renyi_orders = '["2"]'"""),
}


@pytest.mark.parametrize("column", sorted(_DATASET_EDITS))
def test_an_edited_dataset_policy_fails_verify(accountant: Any, column: str) -> None:
    """Mutants A04–A10, A17 (audit.py: a policy field left out of ``dataset_doc``, which both
    writes and verifies the entry, so the drop is consistent and only an edit of that very
    column shows it): a DBA raises a cap, the reporting δ, the per-subject cap, lets the
    dataset release without privacy, or changes its notion or Rényi grid. README: "edits
    … a row … up to the head — detected"."""
    policy, edit = _DATASET_EDITS[column]
    accountant.create_dataset("d", **policy)
    accountant.verify()
    _sql(accountant.ledger, f"UPDATE datasets SET {edit} WHERE name = 'd'")
    with pytest.raises(AuditFailed, match=r"audit entry 1: dataset 1 \('d'\) differs from what "
                                          "the log recorded"):
        accountant.verify()

_RELEASE_EDITS = {
    "diagnostics": ["UPDATE releases SET diagnostics = '{}'"],
    "requester": ["UPDATE releases SET requester = 'someone else'"],
    "created_at": ["UPDATE releases SET created_at = '2001-01-01 00:00:00'"],
    "distribution_version": ["UPDATE releases SET distribution_version = '0.0.1'"],
    "shape": ["""UPDATE releases SET shape = '{"n": 499}'"""],
    # a later, genuine charge claimed as paying for the release too, consistently everywhere
    "charge_ids": ["UPDATE releases SET charge_ids = '[1, 2]'",
                   "INSERT INTO release_charges (charge_id, release_id) VALUES (2, 1)"],
}


@pytest.mark.parametrize("column", sorted(_RELEASE_EDITS))
def test_an_edited_release_fails_verify(accountant: Any, column: str) -> None:
    """Mutants A12–A16, A18 (audit.py: a field left out of ``release_doc``, which both
    writes and verifies the entry): a DBA edits the diagnostics, shape, requester, time,
    distribution version of a release, or adds another charge to those that paid for it
    (a ``release_charges`` row too). README: "edits … a row … up to the head — detected"."""
    import numpy as np

    acct = accountant
    acct.create_dataset("d", rho=1)
    scores = np.random.default_rng(0).random(500)
    acct.calibrate("pcoqs", dataset="d", scores=scores, alpha=0.1, rho=0.1)  # charge 1
    acct.charge("d", ZCDP("0.1"))  # charge 2, paying for nothing
    acct.verify()
    for stmt in _RELEASE_EDITS[column]:
        _sql(acct.ledger, stmt)
    with pytest.raises(AuditFailed, match=r"release 1 differs from what the log recorded"):
        acct.ledger.verify()


def test_a_charge_members_row_without_a_logged_charge_fails_verify(accountant: Any) -> None:
    """Mutant U06 (verify_subjects.py: leftover ``charge_members`` rows not refused): a DBA
    gives a dataset-scope charge a list of "charged" pseudonyms (what an idempotent retry of
    a subject charge would read back as its accepted subjects)."""
    acct = accountant
    acct.create_dataset("d", rho=1, subject_epsilon=1)
    acct.charge("d", ZCDP("0.1"))  # charge 1: dataset scope, no members
    acct.charge_subjects("d", "0.5", ["alice"])  # charge 2
    acct.verify()
    blob = acct.ledger.pseudonyms(["mallory"]).tolist()[0]
    with acct.ledger.engine.begin() as conn:
        conn.execute(text("INSERT INTO charge_members (charge_id, members) VALUES (1, :m)"),
                     {"m": bytes.fromhex(blob)})
    with pytest.raises(AuditFailed, match=r"charge_members of charge 1 has no logged charge"):
        acct.verify()


@pytest.mark.parametrize(("part", "key", "claimed"), [("privacy", "epsilon", "0.5"),
                                                     ("coverage", "lower", 0.9005)])
def test_a_rewritten_release_claiming_a_better_guarantee_does_not_recompute(
        accountant: Any, part: str, key: str, claimed: Any) -> None:
    """Mutants C04 (verification.py: the privacy record's numbers not compared with the
    recomputed ones, only its sentences) and RC1 (record_compare.py: REL_TOL 1e-9 → 1e-3):
    a DBA rewrites the log (no head kept, so the chain itself cannot tell) so that a release
    claims (0.5, 1e-6)-DP instead of the (2.14194, 1e-6) its ρ = 0.1 gives, or a coverage
    lower bound of 0.9005 instead of 0.9 (0.06 % more: within 1e-3, far outside 1e-9).
    README: verify "recomputes each release's coverage and privacy guarantee … its numbers
    and its sentences"."""
    import numpy as np

    acct = accountant
    acct.create_dataset("d", rho=1)
    acct.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(0).random(500),
                   alpha=0.1, rho=0.1)
    led = acct.ledger
    with led.engine.connect() as conn:
        seq, payload = conn.execute(text(
            "SELECT seq, payload FROM audit_log WHERE kind = 'release'")).one()
        stored = conn.execute(text(f"SELECT {part} FROM releases WHERE id = 1")).scalar_one()
    stored = stored if isinstance(stored, dict) else json.loads(stored)
    stored[key] = claimed
    doc = json.loads(payload)
    doc["data"][part] = audit.jsonable(stored)
    _sql(led, f"UPDATE releases SET {part} = :p WHERE id = 1", p=json.dumps(stored))
    _rechain(led, {int(seq): audit.canonical(doc)})
    led.verify()  # the rewritten chain is consistent: only a kept head would tell
    with pytest.raises(AuditFailed, match=rf"release 1 .* does not recompute: {part}.{key}"):
        acct.verify()


def test_same_compares_keys_lengths_bools_and_infinities() -> None:
    """Mutants RC2–RC5 (record_compare.py: a recorded record missing a key of the recomputed
    one, a list cut short, ``true`` for 1 ± 1e-10, or an infinite value for a finite one, each read
    as "the same"): the rule every recorded guarantee is compared by."""
    from privcal.accountant.record_compare import same

    assert same({"a": 1.0, "b": [1, 2]}, {"a": 1.0 + 1e-12, "b": [1, 2]})
    assert not same({"a": 1}, {"a": 1, "b": 2})
    assert not same({"a": 1, "b": 2}, {"a": 1})
    assert not same([1, 2], [1, 2, 3])
    assert not same([1, 2, 3], [1, 2])
    assert not same(True, 1 + 1e-10) and not same(1 - 1e-10, True)  # bools compared exactly
    assert not same(float("inf"), 1e308) and not same(1e308, float("inf"))
    assert not same(float("nan"), 0.0)
    assert same(float("inf"), float("inf")) and same(float("nan"), float("nan"))


@pytest.mark.parametrize("edit", [
    "UPDATE collection_sessions SET shuffled = TRUE",
    "UPDATE collection_sessions SET requester = 'someone else'",
    "UPDATE collection_sessions SET method = 'ldp-label'",
])
def test_an_edited_session_fails_verify(accountant: Any, edit: str) -> None:
    """Mutant SE1 (sessions.py: a session row not compared with its ``session_open`` entry):
    a DBA marks a session shuffled (its release would then report an amplified (ε, δ)),
    changes who opened it, or its method."""
    from privcal.accountant import sessions as S

    acct = accountant
    acct.create_dataset("a", approx_epsilon=20, approx_delta=1e-5, subject_epsilon=20)
    info = S.open_session(acct, "ldp-score", dataset="a", alpha=0.2, epsilon=1.0, rounds=2,
                          group_size=3)
    S.submit_reports(acct, info.id, ["p", "q", "r"], [1, 0, 1], [0] * 3)
    acct.verify()
    _sql(acct.ledger, edit)
    with pytest.raises(AuditFailed, match=rf"session {info.id} differs from what the log"):
        acct.verify()


def test_moved_baseline_units_fail_verify(ledger_url: str, tmp_path: Path) -> None:
    """Mutant U02 (verify_subjects.py: the baseline not compared with the digest the migration
    entry committed): a DBA moves one unit of alice's pre-0005 spend to bob in both
    ``subject_baseline`` and ``subject_spend`` (every per-subject sum then adds up)."""
    acct = landed_ledger(ledger_url, tmp_path)
    a, b = acct.ledger.pseudonyms(["alice", "bob"]).tolist()
    with acct.ledger.engine.begin() as conn:
        for table in ("subject_baseline", "subject_spend"):
            for subj, delta in ((a, -1), (b, 1)):
                conn.execute(text(f"UPDATE {table} SET spent_units = spent_units + :u "
                                  "WHERE subject = :s"), {"u": delta, "s": subj})
    with pytest.raises(AuditFailed, match=r"per-subject baseline of dataset 1 differs"):
        acct.verify()
    acct.close()


def test_a_second_migration_entry_fails_verify(ledger_url: str, tmp_path: Path) -> None:
    """Mutant V12 (verify.py: a second ``migration`` entry accepted, the last one winning): a
    ledger upgraded from the landed schema 0004 has its one migration entry; a DBA appends
    a copy of it (valid chain), which could commit another baseline. Real code: "a second
    migration entry"."""
    acct = landed_ledger(ledger_url, tmp_path)
    led = acct.ledger
    with led.engine.connect() as conn:
        payload = conn.execute(text("SELECT payload FROM audit_log WHERE kind = 'migration'")
                               ).scalar_one()
        seq = conn.execute(text("SELECT seq FROM audit_head")).scalar_one()
    _rechain(led, {}, append=("migration", audit.entry_payload(
        seq + 1, "migration", json.loads(payload)["data"])))
    with pytest.raises(AuditFailed, match=rf"audit entry {seq + 1}: a second migration entry"):
        acct.verify()
    led.close()
