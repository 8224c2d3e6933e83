"""Upgrading a ledger written by the landed privcal (schema 0004) to 0005, with data in it, on
SQLite and PostgreSQL (issue 16 items 3, 6): ids become pseudonyms, caps keep binding the same
people, the old chain still verifies, and from then on the per-subject rows and sessions are
recomputed from the chain.

The data is written by the landed code itself (commit LANDED, exported from git history and
run in a subprocess), not by a re-creation of it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP
from privcal.errors import AuditFailed, InvalidInput
from privcal.storage import Ledger

#: the last landed commit before migration 0005 (its schema head is 0004)
LANDED = "0535d15c0b5fa1484788a8ab03d9e1db0a8da3f5"
ROOT = Path(__file__).resolve().parents[1]

OLD_SCRIPT = """
import sys
import numpy as np
from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP
acct = Accountant(sys.argv[1])
acct.ledger.upgrade()
assert acct.ledger.current() == "0004"
acct.create_dataset("d", rho=1, subject_epsilon=1)
acct.charge_subjects("d", "0.5", ["alice", "bob", "000007"])
acct.charge("d", ZCDP(rho="0.1"), idempotency_key="old-key")
acct.calibrate("pcoqs", dataset="d", scores=np.linspace(0, 1, 300), alpha=0.1, rho=0.2)
acct.create_dataset("s", epsilon=1, subject_epsilon=5)
info = S.open_session(acct, "ldp-score", dataset="s", alpha=0.1, epsilon=1.5, rounds=3,
                      group_size=3)
S.submit_reports(acct, info.id, ["a", "b"], [1, 0])
acct.verify()
print(acct.ledger.head())
"""


def _landed_tree(tmp_path: Path) -> Path:
    try:
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", LANDED, "privcal"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"needs the git history of privcal (commit {LANDED}): {exc}")
    out = tmp_path / "landed"
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(out, filter="data")
    return out


def landed_ledger(ledger_url: str, tmp_path: Path) -> Accountant:
    """An Accountant on a ledger the landed privcal wrote (:data:`OLD_SCRIPT`: schema 0004, a
    local-DP charge of alice, bob and 000007, a session), upgraded to the head and verified:
    one migration entry, a per-subject baseline."""
    tree = _landed_tree(tmp_path)
    done = subprocess.run([sys.executable, "-c", OLD_SCRIPT, ledger_url], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.verify()
    return acct


def test_upgrade_from_the_landed_schema_with_data(ledger_url: str, tmp_path: Path) -> None:
    tree = _landed_tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", OLD_SCRIPT, ledger_url], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    old_head = done.stdout.strip().splitlines()[-1]
    seq = int(old_head.split(":")[0])

    ledger = Ledger(ledger_url)
    assert ledger.upgrade("0005") == "0005"
    assert ledger.upgrade() == ledger.head_revision()  # on to the head (test_migration_0006.py)
    acct = Accountant(ledger)
    # the old chain is intact, and one migration entry commits the baseline
    rep = acct.verify(expect_head=old_head)
    assert rep.entries == seq + 1
    with ledger.engine.connect() as conn:
        stored = [r[0] for r in conn.execute(text("SELECT subject FROM subject_spend"))]
        reports = [r[0] for r in conn.execute(text("SELECT subject FROM session_reports"))]
        kind, payload = conn.execute(text("SELECT kind, payload FROM audit_log WHERE seq = :s"),
                                     {"s": seq + 1}).one()
    assert kind == "migration"
    # written by this code: keyed and salted, never a plain hash of one person's rows that
    # another entry could match (red team 10) or an open round's state (red team 7)
    mig = json.loads(payload)["data"]
    assert mig["sessions"] and mig["subject_spend"]
    for doc in mig["sessions"].values():
        assert doc["state_digest"].startswith("k:") and doc["reports_digest"].startswith("s:")
    assert all(d["digest"].startswith("s:") for d in mig["subject_spend"].values())
    assert sorted(stored) == sorted(ledger.pseudonyms(
        ["alice", "bob", "000007", "a", "b"]).tolist())  # "a", "b": the session charged them
    assert sorted(reports) == sorted(ledger.pseudonyms(["a", "b"]).tolist())
    # the same people keep their spends and caps
    assert acct.subject_spend("d", "alice") == Decimal("0.5")
    assert acct.subject_spend("d", "000007") == Decimal("0.5")
    r = acct.charge_subjects("d", "0.6", ["alice", "carol"])
    assert (r.accepted, r.rejected_over_cap) == (1, 1)
    # a session opened before the upgrade goes on: "a" has answered, "c" has not
    res = S.submit_reports(acct, 1, ["a", "c"], [1, 1], [0, 0])
    assert res.accepted == 1 and res.reasons == {"subject already reported in this session": 1}
    # a key used before the upgrade still replays its charge and refuses another cost
    assert acct.charge("d", ZCDP(rho="0.1"), idempotency_key="old-key").replayed
    with pytest.raises(InvalidInput, match="idempotency key 'old-key'"):
        acct.charge("d", ZCDP(rho="0.2"), idempotency_key="old-key")
    acct.verify()
    # the migrated rows are now covered: moving units between two old subjects is detected
    a, b = ledger.pseudonyms(["alice", "bob"]).tolist()
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE subject_spend SET spent_units = spent_units - 1 "
                          "WHERE subject = :a"), {"a": a})
        conn.execute(text("UPDATE subject_spend SET spent_units = spent_units + 1 "
                          "WHERE subject = :b"), {"b": b})
    with pytest.raises(AuditFailed, match="subject row"):
        acct.verify()
    ledger.close()


def test_a_rewritten_baseline_with_negative_units_fails_verify(ledger_url: str,
                                                               tmp_path: Path) -> None:
    """Red team 13 (F1's second rule): a subject's baseline is what she spent before 0005,
    never below 0. A database administrator who rewrites the log from the migration entry on
    (a new baseline digest, every later hash recomputed: without ``--expect-head`` or a
    signed head a rewrite is not detected, README's table) moved alice's 0.5 and 0.25 more
    to bob, keeping every sum, so alice could be charged 0.75 beyond her cap of 1; verify
    passed. A negative baseline now fails."""
    from privcal.storage import audit, pseudonyms
    from privcal.storage.models import spend_units
    from tests.test_red_team_8_accounting import _rechain

    acct = landed_ledger(ledger_url, tmp_path)
    ledger = acct.ledger
    a, b = ledger.pseudonyms(["alice", "bob"]).tolist()
    u = spend_units(Decimal("0.75"))
    with ledger.engine.begin() as conn:
        d = conn.execute(text("SELECT id FROM datasets WHERE name = 'd'")).scalar_one()
        for subj, delta in ((a, -u), (b, u)):
            for table in ("subject_baseline", "subject_spend"):
                conn.execute(text(f"UPDATE {table} SET spent_units = spent_units + :u "
                                  "WHERE dataset_id = :d AND subject = :s"),
                             {"u": delta, "d": d, "s": subj})
        rows = [(s, int(n)) for s, n in conn.execute(text(
            "SELECT subject, spent_units FROM subject_baseline WHERE dataset_id = :d"),
            {"d": d})]
        seq, payload = conn.execute(text(
            "SELECT seq, payload FROM audit_log WHERE kind = 'migration'")).one()
    doc = json.loads(payload)["data"]
    doc["subject_spend"][str(d)]["digest"] = pseudonyms.spend_digest(rows)
    _rechain(ledger, {seq: audit.entry_payload(seq, "migration", doc)})
    assert acct.subject_spend("d", "alice") == Decimal("-0.25")
    with pytest.raises(AuditFailed, match=r"baseline of dataset \d+ holds negative units"):
        acct.verify()
    ledger.close()
