"""Red team 5 (audit): what ``audit verify`` did not check. Each test is an attack that used to
verify; it passes when verification (or the write) fails naming what was wrong.

- F1: a release was never checked to be paid for: through ``Accountant.record_release``, a
  release with no charge, one paid by a charge of ρ = 10⁻⁶ while claiming ρ = 0.1, and one
  reusing another release's charge all verified (0.4 claimed against a 0.2 cap);
- F1b: the guarantee *sentences* were never compared: a release whose coverage and privacy
  statements were false verified;
- F2: ``collection_sessions.release_id`` (the session's result, as devices read it) was not
  compared with the release its ``session_close`` entry named;
- F4 (PostgreSQL): with a signed head, an entry still in ``audit_queue`` (a read-only
  connection cannot chain it) passed as if signed; ``--expect-head`` passed over it silently;
- F5: ``session_batches`` rows (the result a retry replays) were not verified.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from sqlalchemy import text

from privcal.accountant import sessions as S
from privcal.accountant.releases import record_release
from privcal.costs import ZCDP, LocalDP
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage.audit import release_doc
from tests.seeded import Seeded

_pg = pytest.mark.parametrize("ledger_url", [pytest.param("postgresql",
                                                          marks=pytest.mark.postgres)],
                              indirect=True)


def _written(acct: Any) -> tuple[int, ...]:
    """Charges, releases and audit entries (chained or queued) in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())
                     for t in ("charges", "releases", "audit_log", "audit_queue"))


def _genuine(acct: Any, cap: str = "0.2") -> Any:
    acct.create_dataset("d", rho=cap)
    return acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="d",
                          scores=np.random.default_rng(0).uniform(size=3000),
                          rng=Seeded(0))


def _fields(r: Any, **change: Any) -> dict[str, Any]:
    """``record_release``'s keywords that copy release ``r``."""
    cov = r.coverage if isinstance(r.coverage, dict) else r.coverage.model_dump(mode="json")
    return {"method": r.method, "calibrator_version": r.calibrator_version,
            "threshold": r.threshold, "params": r.params, "shape": r.shape, "coverage": cov,
            "privacy": r.privacy, "diagnostics": r.diagnostics, "distribution": r.distribution,
            "distribution_version": r.distribution_version, **change}


def _insert_release(acct: Any, dataset: str, r: Any, charge_ids: list[int]) -> int:
    """A copy of release ``r`` written as privcal's own writers do (row and audit entry in one
    transaction, a valid chain) but without ``record_release``'s checks: what a writer that
    skips them, or an older privcal, could leave in the ledger."""
    from privcal.storage.audit import threshold_str

    f = _fields(r)
    led = acct.ledger

    def tx(s: Any) -> int:
        ds = led.lock_dataset(s, dataset)
        # a charge already paying for a release: refused by release_charges' primary key
        # since migration 0009, which keeps a second release of an older ledger out of it
        owned = led.charge_owners(s, charge_ids)
        row = led.insert_release(s, ds.id, {
            "method": f["method"], "calibrator_version": f["calibrator_version"],
            "distribution": f["distribution"], "distribution_version": f["distribution_version"],
            "params": f["params"], "shape": f["shape"], "threshold": threshold_str(f["threshold"]),
            "coverage": f["coverage"], "privacy": f["privacy"], "diagnostics": f["diagnostics"],
            "requester": None}, [i for i in charge_ids if i not in owned])
        row.charge_id, row.charge_ids = (charge_ids[0] if charge_ids else None), charge_ids
        s.flush()
        led.append_audit(s, "release", release_doc(row, ds.name))
        return int(row.id)

    return int(led.write(tx))


# ------------------------------------------------------------------ F1: paid for
def test_record_release_refuses_a_release_its_charges_do_not_pay_for(accountant: Any) -> None:
    acct = accountant
    r = _genuine(acct, cap="1")
    tiny = acct.charge("d", ZCDP(rho="0.000001")).charge_id
    other = acct.charge("d", ZCDP(rho="0.05")).charge_id
    before = _written(acct)
    with pytest.raises(InvalidInput, match="names no charge that paid for it"):
        acct.record_release("d", **_fields(r), charge_ids=[])
    with pytest.raises(InvalidInput, match=r"costs ρ = 0\.1 .* cost ρ = 0\.000001 in all"):
        acct.record_release("d", **_fields(r), charge_ids=[tiny])
    with pytest.raises(InvalidInput, match=f"charge {r.charge_ids[0]} already has a release"):
        acct.record_release("d", **_fields(r), charge_ids=[tiny, r.charge_ids[0]])
    with pytest.raises(InvalidInput, match="twice"):
        acct.record_release("d", **_fields(r), charge_ids=[other, other])
    assert _written(acct) == before
    # paid in full by two charges of its own: recorded, and it verifies
    top = acct.charge("d", ZCDP(rho="0.05")).charge_id
    rel = acct.record_release("d", **_fields(r), charge_ids=[other, top])
    assert rel.charge_ids == [other, top] and acct.verify().guarantees_recomputed == 2
    # a non-private release needs no charge
    acct.create_dataset("open", rho=1, allow_nonprivate=True)
    sp = acct.calibrate("split", {"alpha": 0.1}, dataset="open", scores=np.arange(50.0))
    assert acct.record_release("open", **_fields(sp)).charge_ids == []


def test_record_release_refuses_a_local_release_charged_a_smaller_eps0(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("l", rho=1, subject_epsilon=10)
    scores = np.random.default_rng(1).random(2000)
    ls = acct.calibrate("ldp-score", dataset="l", scores=scores, alpha=0.1, epsilon=2,
                        subjects=[f"u{i}" for i in range(2000)], rng=Seeded(0))
    small = acct.charge_subjects("l", LocalDP(eps0="0.5"), ["x", "y"]).charge_id
    central = acct.charge("l", ZCDP(rho="0.5")).charge_id
    with pytest.raises(InvalidInput, match=r"costs ε0 = 2 per subject, but charge .* ε0 = 0\.5"):
        acct.record_release("l", **_fields(ls), charge_ids=[small])
    with pytest.raises(InvalidInput, match=r"none of its charges .* is a per-subject charge"):
        acct.record_release("l", **_fields(ls), charge_ids=[central])


@pytest.mark.parametrize("case", ["no charge", "tiny charge", "another release's charge",
                                  "another dataset's charge"])
def test_verify_fails_on_a_release_not_paid_for(accountant: Any, case: str) -> None:
    """The f1 repro, its releases written past ``record_release``'s checks: the ledger's own
    verification fails on each (before, all verified: 0.4 claimed against a 0.2 cap)."""
    acct = accountant
    r = _genuine(acct)
    acct.create_dataset("e", rho=1)
    ids = {"no charge": [],
           "tiny charge": [acct.charge("d", ZCDP(rho="0.000001")).charge_id],
           "another release's charge": [acct.charge("d", ZCDP(rho="0.000001")).charge_id,
                                        r.charge_ids[0]],
           "another dataset's charge": [acct.charge("e", ZCDP(rho="0.1")).charge_id]}[case]
    bad = _insert_release(acct, "d", r, ids)
    want = {"no charge": "names no charge that paid for it",
            "tiny charge": r"costs ρ = 0\.1 \(zcdp\), but its charges .* cost ρ = 0\.000001",
            "another release's charge": f"charge {r.charge_ids[0]} already paid for release "
                                        f"{r.id}",
            "another dataset's charge": "a charge of another dataset"}[case]
    with pytest.raises(AuditFailed, match=f"release {bad}.*{want}"):
        acct.ledger.verify()
    with pytest.raises(AuditFailed, match=f"release {bad}"):
        acct.verify()


def test_every_kind_of_release_privcal_writes_is_paid_for(accountant: Any) -> None:
    """Central, local with a shuffled central part, a session with its batches' charges
    and a non-private federated session: each verifies (and the check found their charges)."""
    from privcal.calibrators.fedcp_qq import fedcp_qq_message, plan_fedcp_qq

    acct = accountant
    acct.create_dataset("a", approx_epsilon=20, approx_delta=1e-5, subject_epsilon=20)
    s = np.random.default_rng(5).random(4000)
    users = [f"u{i}" for i in range(4000)]
    sh = acct.calibrate("ldp-score", dataset="a", scores=s, alpha=0.1, epsilon=2,
                        subjects=users, shuffled=True, rng=Seeded(0))
    assert len(sh.charge_ids) == 2 and "central_cost" in sh.privacy
    info = S.open_session(acct, "ldp-score", dataset="a", alpha=0.2, epsilon=1.0, rounds=2,
                          group_size=3)
    for rnd, ids in enumerate((["p", "q", "r"], ["s", "t", "w"])):
        S.submit_reports(acct, info.id, ids, [1, 0, 1], [rnd] * 3)
    done = S.session_status(acct, info.id)
    assert done.status == "released"
    assert len(acct.release(done.release_id).charge_ids) == 2
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    plan = plan_fedcp_qq(5, 10, 0.1)
    fq = S.open_session(acct, "fedcp-qq", dataset="np", alpha=0.1, agents=5, local_n=10)
    rng = random.Random(1)
    S.submit_reports(acct, fq.id, [f"a{j}" for j in range(5)], [
        fedcp_qq_message(np.array([rng.random() for _ in range(10)]), plan) for _ in range(5)])
    assert acct.verify().guarantees_recomputed == 3


# ------------------------------------------------------------------ F1b: the sentences
@pytest.mark.parametrize("what", ["coverage.statement", "coverage.over",
                                  "privacy.statement", "privacy.neighbouring"])
def test_a_release_with_a_false_sentence_does_not_verify(accountant: Any, what: str) -> None:
    acct = accountant
    r = _genuine(acct, cap="1")
    f = _fields(r)
    f["coverage"], f["privacy"] = copy.deepcopy(f["coverage"]), copy.deepcopy(f["privacy"])
    part, key = what.split(".")
    f[part][key] = {"statement": "P(Y in C(X)) >= 0.999 for every test point"
                    if part == "coverage" else "0.001-DP (pure), no assumptions",
                    "over": "nothing", "neighbouring": "add/remove of any number of people"}[key]
    paid = acct.charge("d", ZCDP(rho="0.1")).charge_id
    # record_release now refuses it (second review, F2); written past that check, verify
    # finds it
    with pytest.raises(InvalidInput, match=f"does not state what the installed code states: "
                                           f"{what}: recorded"):
        acct.record_release("d", **f, charge_ids=[paid])
    bad = record_release(acct.ledger, "d", **f, charge_ids=[paid], _as_computed=True)
    with pytest.raises(AuditFailed, match=f"release {bad.id} .*{what}: recorded"):
        acct.verify()


def test_older_wording_is_counted_as_not_compared(accountant: Any) -> None:
    """A P-COQS 2.1.0 release, whose sentences the installed code writes (``guarantee_as``),
    is compared; a 2.0.0 one whose statement the installed code does not reproduce (its
    wording then) verifies by its numbers, and the report says one sentence was not compared.
    A release of the installed version is always compared."""
    from privcal.calibrators.base import DataShape
    from privcal.calibrators.registry import get

    acct = accountant
    r = _genuine(acct, cap="1")
    cal = get("pcoqs").calibrator

    def copy_as(version: str, statement: str | None = None) -> int:
        cov = cal.guarantee_as(version, cal.Params.model_validate(r.params),
                               DataShape(**r.shape)).model_dump(mode="json")
        if statement is not None:
            cov["statement"] = statement
        paid = acct.charge("d", ZCDP(rho="0.1")).charge_id
        # an older version as it was written: past the public API's check (F2)
        return record_release(acct.ledger, "d", _as_computed=True,
                              **_fields(r, calibrator_version=version, coverage=cov),
                                   charge_ids=[paid]).id

    copy_as("2.1.0")
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (2, 0)
    assert "not compared" not in rep.summary
    copy_as("2.0.0", statement="an older wording of the same bound")
    rep = acct.verify()
    assert (rep.guarantees_recomputed, rep.statements_not_compared) == (3, 1)
    assert ("1 guarantee sentence not reproduced by the installed code (older wording) not "
            "compared" in rep.summary)
    bad = copy_as("2.3.0", statement="an older wording of the same bound")
    with pytest.raises(AuditFailed, match=f"release {bad} .*coverage.statement"):
        acct.verify()


# ------------------------------------------------------------------ F2: a session's release
def _released_sessions(acct: Any) -> tuple[list[tuple[int, int]], int]:
    from privcal.calibrators.fedcp_qq import fedcp_qq_message, plan_fedcp_qq

    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    plan = plan_fedcp_qq(5, 10, 0.1)
    rels = []
    for seed in (1, 2):
        info = S.open_session(acct, "fedcp-qq", dataset="np", alpha=0.1, agents=5, local_n=10)
        rng = random.Random(seed)
        msgs = [fedcp_qq_message(np.array([rng.random() for _ in range(10)]), plan)
                for _ in range(5)]
        res = S.submit_reports(acct, info.id, [f"a{j}" for j in range(5)], msgs)
        rels.append((info.id, res.session.release_id))
    acct.create_dataset("other", rho=1)
    other = acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="other",
                           scores=np.random.default_rng(0).uniform(size=3000))
    return rels, other.id


@pytest.mark.parametrize("to", ["another dataset's release", "the other session's release",
                                "no release"])
def test_editing_a_sessions_release_is_detected(accountant: Any, to: str) -> None:
    acct = accountant
    rels, other = _released_sessions(acct)
    acct.verify()
    (sid, _), (_, second) = rels
    new = {"another dataset's release": other, "the other session's release": second,
           "no release": None}[to]
    with acct.ledger.engine.begin() as conn:
        conn.execute(text("UPDATE collection_sessions SET release_id = :r WHERE id = :s"),
                     {"r": new, "s": sid})
    with pytest.raises(AuditFailed, match=f"session {sid}'s release is {new}, but the log "
                                          "records"):
        acct.verify()


# ------------------------------------------------------------------ F5: session batches
@pytest.mark.parametrize("tamper", ["result", "key", "delete", "insert"])
def test_editing_a_session_batch_row_is_detected(accountant: Any, tamper: str) -> None:
    """The f5 repro: a batch's recorded result rewritten to "nothing accepted" made a retry
    under its key replay the edit while verify passed; so did its key, a deleted row, an
    inserted one."""
    acct = accountant
    acct.create_dataset("d", rho="1", subject_epsilon="3")
    info = S.open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=2,
                          group_size=10)
    S.submit_reports(acct, info.id, ["a", "b", "c"], [1, 0, 1], [0, 0, 0], idempotency_key="b1")
    acct.verify()
    with acct.ledger.engine.begin() as conn:
        if tamper == "result":
            res = conn.execute(text("SELECT result FROM session_batches")).scalar()
            res = json.loads(res) if isinstance(res, str) else res
            res.update(accepted=0, rejected=3, charge_id=None,
                       reasons={"subject over its per-subject cap": 3})
            conn.execute(text("UPDATE session_batches SET result = :r"), {"r": json.dumps(res)})
        elif tamper == "key":
            conn.execute(text("UPDATE session_batches SET idempotency_key = 'b2'"))
        elif tamper == "delete":
            conn.execute(text("DELETE FROM session_batches"))
        else:
            conn.execute(text(
                "INSERT INTO session_batches (session_id, batch, idempotency_key, "
                "request_digest, result, created_at) SELECT session_id, 2, 'b9', "
                "request_digest, result, created_at FROM session_batches"))
    want = {"result": "batch 1 .* differs from what the log recorded",
            "key": "batch 1 .* differs from what the log recorded",
            "delete": "batch 1 is missing from session_batches",
            "insert": "batch 2 of session_batches has no audit entry"}[tamper]
    with pytest.raises(AuditFailed, match=want):
        acct.verify()


# ------------------------------------------------------------------ F4: queued entries
@_pg
def test_a_queued_entry_is_not_covered_by_a_signed_or_expected_head(
        accountant: Any, ledger_url: str, tmp_path: Path) -> None:
    """The f4 repro: a forged charge and its entry put in ``audit_queue``; an auditor on a
    read-only connection (which cannot chain it) verifies with the signed head: it fails,
    naming the queued entry; ``--allow-unsigned-tail`` counts it; ``--expect-head`` says
    it is not covered."""
    from privcal.accountant import Accountant
    from privcal.storage import Ledger, audit, signing
    from privcal.storage.models import Charge

    acct = accountant
    acct.create_dataset("d", rho="1")
    acct.charge("d", ZCDP(rho="0.5"), purpose="genuine")
    key = tmp_path / "k"
    signing.generate_keypair(key)
    head = acct.ledger.head()
    signed = signing.sign_head(head, key).model_dump()
    with acct.ledger.engine.begin() as c:
        c.execute(text("UPDATE datasets SET spent_zcdp_rho = spent_zcdp_rho + 0.4, "
                       "charge_count = charge_count + 1 WHERE name = 'd'"))
        cid = c.execute(text(
            "INSERT INTO charges (dataset_id, scope, notion, rho, purpose, created_at) "
            "VALUES (1, 'dataset', 'zcdp', 0.4, 'forged', now()) RETURNING id")).scalar()
        row = c.execute(text("SELECT * FROM charges WHERE id = :i"), {"i": cid}).mappings().one()
        prefix = audit.entry_prefix("charge", audit.charge_doc(Charge(**dict(row)), "d"))
        c.execute(text("INSERT INTO audit_queue (kind, prefix) VALUES ('charge', :p)"),
                  {"p": prefix})
    ro = Accountant(Ledger(ledger_url + quote(" -cdefault_transaction_read_only=on")))
    try:
        with pytest.raises(AuditFailed, match=r"queued audit entry .*it would be entry 3\): "
                                              "not signed by the trusted key"):
            ro.verify(signed_head=signed, trusted_key=f"{key}.pub")
        rep = ro.verify(signed_head=signed, trusted_key=f"{key}.pub", allow_unsigned_tail=True)
        assert (rep.signed_through, rep.unsigned_entries, rep.queued) == (2, 1, 1)
        rep = ro.verify(expect_head=str(head))
        assert (rep.expected_through, rep.after_expected, rep.queued) == (2, 1, 1)
        assert "1 later entry (1 still queued) not covered by it" in rep.summary
    finally:
        ro.ledger.close()
