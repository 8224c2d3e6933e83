"""Upgrading a ledger written by the landed privcal (schema 0005) to 0006 (the audit queue,
issue 11), with data in it, on SQLite and PostgreSQL: the old chain still verifies up to its
head, new writes chain after it; and a downgrade chains any queued entry first, so the landed
code verifies the result.

The data is written and re-verified by the landed code itself (commit LANDED, exported from git
history and run in a subprocess), not by a re-creation of it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from privcal.accountant import Accountant
from privcal.costs import ZCDP
from privcal.storage import Ledger
from tests.test_audit_queue import _sequencer_busy

#: the last landed commit before migration 0006 (its schema head is 0005)
LANDED = "adbd77979de96a3bda60a44610b4486af0a20cfb"
ROOT = Path(__file__).resolve().parents[1]

OLD_WRITE = """
import sys
import numpy as np
from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP
acct = Accountant(sys.argv[1])
acct.ledger.upgrade()
assert acct.ledger.current() == "0005"
acct.create_dataset("d", rho=1, subject_epsilon=1)
acct.charge_subjects("d", "0.5", ["alice", "bob"])
acct.charge("d", ZCDP(rho="0.1"), idempotency_key="old-key")
acct.calibrate("pcoqs", dataset="d", scores=np.linspace(0, 1, 300), alpha=0.1, rho=0.2)
acct.create_dataset("s", epsilon=1, subject_epsilon=5)
info = S.open_session(acct, "ldp-score", dataset="s", alpha=0.1, epsilon=1.5, rounds=3,
                      group_size=3)
S.submit_reports(acct, info.id, ["a", "b"], [1, 0])
acct.verify()
print(acct.ledger.head())
"""

OLD_VERIFY = """
import sys
from privcal.accountant import Accountant
acct = Accountant(sys.argv[1])
assert acct.ledger.current() == "0005"
print(acct.verify(expect_head=sys.argv[2]).entries)
"""


def _landed(tmp_path: Path, script: str, *args: str) -> str:
    tree = tmp_path / "landed"
    if not tree.exists():
        try:
            tar = subprocess.run(["git", "-C", str(ROOT), "archive", LANDED, "privcal"],
                                 capture_output=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"needs the git history of privcal (commit {LANDED}): {exc}")
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            tf.extractall(tree, filter="data")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_upgrade_from_0005_and_downgrade_drains_the_queue(
        ledger_url: str, tmp_path: Path) -> None:
    old_head = _landed(tmp_path, OLD_WRITE, ledger_url)
    seq = int(old_head.split(":")[0])

    ledger = Ledger(ledger_url)
    assert ledger.upgrade() == ledger.head_revision()
    with ledger.engine.connect() as conn:
        assert inspect(conn).has_table("audit_queue")
        assert conn.execute(text("SELECT count(*) FROM audit_queue")).scalar_one() == 0
    acct = Accountant(ledger)
    rep = acct.verify(expect_head=old_head)  # the old chain, unchanged: no entry added
    assert (rep.entries, rep.queued) == (seq, 0)
    assert acct.charge("d", ZCDP(rho="0.1"), idempotency_key="old-key").replayed
    acct.charge("d", ZCDP(rho="0.2"))
    queued = 0
    if ledger.backend == "postgresql":  # leave one entry queued (its write found K busy)
        with _sequencer_busy(ledger):
            acct.charge("d", ZCDP(rho="0.05"))
        queued = 1
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM audit_queue")).scalar_one() == queued
        chained = conn.execute(text("SELECT max(seq) FROM audit_log")).scalar_one()
    assert chained == seq + 1

    # downgrade: the queued entry is chained first, and the landed code verifies it all
    ledger.downgrade("0005")
    with ledger.engine.connect() as conn:
        assert not inspect(conn).has_table("audit_queue")
        head = conn.execute(text("SELECT seq, entry_hash FROM audit_head")).one()
    assert head[0] == seq + 1 + queued
    ledger.close()
    assert int(_landed(tmp_path, OLD_VERIFY, ledger_url, f"{head[0]}:{head[1]}")) == head[0]

    ledger = Ledger(ledger_url)
    assert ledger.upgrade() == ledger.head_revision()
    assert Accountant(ledger).verify(expect_head=f"{head[0]}:{head[1]}").charges == 5 + queued
    ledger.close()
