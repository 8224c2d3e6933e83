"""Migration 0009: ``release_charges`` (which release each charge paid for), back-filled
from the releases' ``charge_ids``; a downgrade drops it, an upgrade rebuilds it; a charge
named by two releases of an old ledger does not stop the upgrade, and verify reports it."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sqlalchemy import inspect, text

from privcal import Accountant, Ledger
from privcal.costs import ZCDP
from privcal.errors import AuditFailed


def _links(ledger: Ledger) -> list[tuple[int, int]]:
    with ledger.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT charge_id, release_id FROM release_charges ORDER BY charge_id"))]


def _world(ledger_url: str) -> tuple[Ledger, Accountant, list[Any]]:
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("z", rho=10, subject_epsilon=5)
    s = np.random.default_rng(1).beta(2, 5, 300)
    rels = [acct.calibrate("pcoqs", dataset="z", scores=s, alpha=0.1, rho=0.1) for _ in range(2)]
    rels.append(acct.calibrate("ldp-score", dataset="z", scores=s[:60], subjects=np.arange(60),
                               alpha=0.1, epsilon=1))
    return ledger, acct, rels


def test_downgrade_drops_and_upgrade_backfills_the_table(ledger_url: str) -> None:
    ledger, acct, rels = _world(ledger_url)
    want = sorted((c, r.id) for r in rels for c in r.charge_ids)
    assert _links(ledger) == want
    ledger.downgrade("0008")
    assert "release_charges" not in inspect(ledger.engine).get_table_names()
    assert ledger.upgrade() == ledger.head_revision()  # (0010 after it)
    assert _links(ledger) == want
    assert acct.verify().guarantees_recomputed == 3
    ledger.close()


def test_a_charge_named_by_two_releases_keeps_its_first_and_verify_reports_it(
        ledger_url: str) -> None:
    ledger, _acct, rels = _world(ledger_url)
    ledger.downgrade("0008")
    # an old ledger in which release 2 also names release 1's charge (what the review found
    # an older record_release could write)
    first, second = rels[0], rels[1]
    ids = [*second.charge_ids, first.charge_ids[0]]
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE releases SET charge_ids = :ids WHERE id = :r"),
                     {"ids": json.dumps(ids), "r": second.id})
    assert ledger.upgrade() == ledger.head_revision()  # no crash (0010 after it)
    links = dict(_links(ledger))
    assert links[first.charge_ids[0]] == first.id and links[second.charge_ids[0]] == second.id
    with pytest.raises(AuditFailed):
        ledger.verify()
    ledger.close()


def test_the_primary_key_refuses_a_second_release_of_a_charge(ledger_url: str) -> None:
    from sqlalchemy.exc import IntegrityError

    ledger, acct, _rels = _world(ledger_url)
    paid = acct.charge("z", ZCDP("0.1")).charge_id
    with ledger.engine.begin() as conn:
        conn.execute(text("INSERT INTO release_charges (charge_id, release_id) VALUES (:c, 1)"),
                     {"c": paid})
    with pytest.raises(IntegrityError), ledger.engine.begin() as conn:
        conn.execute(text("INSERT INTO release_charges (charge_id, release_id) VALUES (:c, 2)"),
                     {"c": paid})
    ledger.close()
