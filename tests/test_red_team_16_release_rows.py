"""Red team 16, F5: a release row edited in the database (its threshold) was used by
``predict``/``evaluate`` and by the library's ``Accountant.release`` — coverage 0.60 against a
recorded ≥ 0.9 — while only ``audit verify`` noticed. A release loaded to predict with is now
compared with its audit entry (the comparison ``audit verify`` makes for it) and refused,
on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.accountant import Accountant
from privcal.cli import main
from privcal.errors import AuditFailed
from tests.seeded import Seeded

CLASSES = ["a", "b", "c", "d"]


def _data(gen: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    p = np.exp(gen.normal(size=(n, 4)) * 2)
    p /= p.sum(1, keepdims=True)
    y = np.array([gen.choice(4, p=q) for q in p])
    return p, y


def _sql(ledger: Any, stmt: str, **params: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(stmt), params)


@pytest.fixture
def made(ledger: Any, tmp_path: Path) -> dict[str, Any]:
    """A pcoqs release (id 1) and a held-out table of probabilities and labels."""
    acct = Accountant(ledger)
    acct.create_dataset("d", rho=10)
    gen = np.random.default_rng(4)
    p, y = _data(gen, 2000)
    rel = acct.calibrate("pcoqs", dataset="d", probs=pd.DataFrame(p, columns=CLASSES),
                         labels=np.array(CLASSES)[y], score="lac", alpha=0.1, rho=1,
                         rng=Seeded(0))
    pt, yt = _data(gen, 500)
    test = pd.DataFrame(pt, columns=CLASSES)
    test["label"] = np.array(CLASSES)[yt]
    test.to_csv(tmp_path / "test.csv", index=False)
    url = ledger.engine.url.render_as_string(hide_password=False)
    return {"acct": acct, "rel": rel, "url": url, "csv": str(tmp_path / "test.csv")}


def _cli(made: dict[str, Any], *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", made["url"], *args])


def _uses(made: dict[str, Any]) -> list[list[str]]:
    rid, csv = str(made["rel"].id), made["csv"]
    return [["predict", "--release", rid, "--probs", csv, "--columns", ",".join(CLASSES)],
            ["evaluate", "--release", rid, "--probs", csv, "--label-column", "label"],
            ["evaluate", "--release", rid, "--probs", csv, "--label-column", "label", "--json"],
            ["release", "show", rid]]


def test_unedited_release_is_used(made: dict[str, Any]) -> None:
    for args in _uses(made):
        res = _cli(made, *args)
        assert res.exit_code == 0, (args, res.output)
        assert res.stdout
    assert made["acct"].release(made["rel"].id) == made["rel"]


@pytest.mark.parametrize("edit", [
    "UPDATE releases SET threshold = '0.5' WHERE id = :i",
    "UPDATE releases SET threshold = 'Infinity' WHERE id = :i",
    "DELETE FROM audit_log WHERE kind = 'release'",  # its entry deleted: no entry
])
def test_edited_release_row_is_refused(made: dict[str, Any], edit: str) -> None:
    rid = made["rel"].id
    _sql(made["acct"].ledger, edit, i=rid)
    for args in _uses(made):
        res = _cli(made, *args)
        assert res.exit_code == 4, (args, res.output)
        if "--json" in args:  # the error document only, as every --json error
            err = json.loads(res.stdout)["error"]
            assert err["type"] == "AuditFailed" and err["exit_code"] == 4
            message = err["message"]
        else:
            assert res.stdout == "", (args, res.stdout)  # nothing used, nothing printed
            assert res.stderr.count("\n") == 1, res.stderr
            message = res.stderr
        assert f"release {rid} refused: " in message
        assert "run `privcal audit verify`" in message
    with pytest.raises(AuditFailed, match=rf"^release {rid} refused: .*privcal audit verify"):
        made["acct"].release(rid)
    # unchecked on request (the replay paths and the service's visibility check use it)
    assert made["acct"].release(rid, checked=False).id == rid
    assert _cli(made, "audit", "verify").exit_code == 4


def test_threshold_edit_names_the_entry_as_audit_verify_does(made: dict[str, Any]) -> None:
    rid = made["rel"].id
    _sql(made["acct"].ledger, "UPDATE releases SET threshold = '0.5' WHERE id = :i", i=rid)
    with pytest.raises(AuditFailed) as verify:
        made["acct"].ledger.verify()
    with pytest.raises(AuditFailed) as used:
        made["acct"].release(rid)
    # the same comparison and sentence, prefixed and suffixed
    assert str(used.value) == (f"release {rid} refused: {verify.value}; run "
                               "`privcal audit verify`")
    assert "differs from what the log recorded (threshold or another field edited)" in str(
        used.value)


def test_entry_edited_without_its_hash_is_refused(made: dict[str, Any]) -> None:
    """The row and its entry both edited (threshold 0.5 in each): the entry's hash no longer
    matches its payload."""
    rid = made["rel"].id
    led = made["acct"].ledger
    with led.engine.begin() as conn:
        seq, payload = conn.execute(text(
            "SELECT seq, payload FROM audit_log WHERE kind = 'release'")).one()
        thr = made["acct"].release(rid).model_dump()["threshold"]
        new = payload.replace(f'"threshold":"{thr!r}"', '"threshold":"0.5"')
        assert new != payload
        conn.execute(text("UPDATE audit_log SET payload = :p WHERE seq = :s"),
                     {"p": new, "s": seq})
        conn.execute(text("UPDATE releases SET threshold = '0.5' WHERE id = :i"), {"i": rid})
    with pytest.raises(AuditFailed, match=rf"audit entry {seq}: hash does not match"):
        made["acct"].release(rid)


def test_other_releases_are_unaffected(made: dict[str, Any]) -> None:
    """Another release's edit refuses that release only; ids ≥ 10 are not confused with 1."""
    acct = made["acct"]
    gen = np.random.default_rng(5)
    rels = []
    for _ in range(10):
        p, y = _data(gen, 300)
        rels.append(acct.calibrate("pcoqs", dataset="d", probs=pd.DataFrame(p, columns=CLASSES),
                                   labels=np.array(CLASSES)[y], score="lac", alpha=0.1,
                                   rho=0.1, rng=Seeded(1)))
    last = rels[-1].id
    assert last >= 10
    _sql(acct.ledger, "UPDATE releases SET threshold = '0.5' WHERE id = :i", i=last)
    with pytest.raises(AuditFailed, match=rf"^release {last} refused"):
        acct.release(last)
    for r in [made["rel"], *rels[:-1]]:
        assert acct.release(r.id) == r
