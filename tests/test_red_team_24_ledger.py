"""Red team 24, ledger: the SQL ledger against its environment and its storage-level API.

F1: a PostgreSQL server, database or role whose session defaults differ from PostgreSQL's own
(``standard_conforming_strings=off``, a non-ISO ``DateStyle``, a non-UTF8 ``client_encoding``,
all legal ``ALTER DATABASE/ROLE … SET`` choices) made every write or read a driver traceback:
privcal now sets the session settings it relies on, on each of its connections.

F2: a cap raised around a charge and put back (red team 23, F7) failed ``Accountant.verify``
but ``Ledger.verify`` said ok and ``Ledger.sign_head`` signed the overspent log; the storage's
verification now checks pure-ε and ρ-zCDP caps itself.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.costs import ZCDP, PureDP
from privcal.storage import Ledger


def _with_options(url: str, setting: str) -> str:
    """``url`` (a PostgreSQL test URL with ``options=-csearch_path=…``) with one more
    ``-c`` server setting in its ``options``, as a database or role default would give it."""
    options = parse_qs(urlsplit(url).query)["options"][0]
    base = url.split("options=", 1)[0]
    return f"{base}options={quote(f'{options} -c{setting}')}"


@pytest.mark.parametrize("ledger_url", [pytest.param("postgresql", marks=pytest.mark.postgres)],
                         indirect=True)
@pytest.mark.parametrize("setting", ["standard_conforming_strings=off", "DateStyle=SQL,DMY",
                                     "DateStyle=Postgres,MDY", "client_encoding=LATIN1"])
def test_a_server_with_other_session_defaults_is_written_and_verified(
        ledger_url: str, setting: str) -> None:
    url = _with_options(ledger_url, setting)
    with Accountant(Ledger(url)) as acct:
        acct.ledger.upgrade()
        acct.create_dataset("p", rho=1, description="ε₋ — a\\b", subject_epsilon=2)
        for _ in range(3):  # the second and later go the one-round-trip path
            acct.charge("p", PureDP(eps="0.1"), purpose="x\\y ₋")
        acct.charge("p", ZCDP(rho="0.01"), idempotency_key="k\\₋")
        acct.charge_subjects("p", "0.5", ["alice", "bob"])
        info = S.open_session(acct, "ldp-score", dataset="p", alpha=0.1, epsilon=1.5,
                              rounds=3, group_size=3)
        S.submit_reports(acct, info.id, ["a", "b", "c"], [1, 0, 1], [0, 0, 0])
        rel = acct.calibrate("pcoqs", {"alpha": 0.1, "rho": 0.1}, dataset="p",
                             scores=np.random.default_rng(0).random(300))
        assert acct.release(rel.id).threshold == rel.threshold
        rep = acct.verify()
        assert rep.entries == acct.ledger.head().seq and rep.guarantees_recomputed == 1
        got: Any = acct.budget("p").spent
        assert got["rho"] > 0


# ------------------------------------------------- F2: the storage-level verify and sign_head
def _edit(ledger: Ledger, sql: str) -> None:
    """Edit the database behind privcal's back (what a database administrator can do)."""
    from sqlalchemy import text

    with ledger.engine.begin() as conn:
        conn.execute(text(sql))


@pytest.mark.parametrize(("cap", "cost", "big", "message"), [
    ({"epsilon": 1}, PureDP(eps="0.8"), PureDP(eps=5),
     r"dataset 1 \('d'\): its logged charges spend epsilon=5\.8 of its cap ε ≤ 1 \(pure DP\)"),
    ({"rho": "0.5"}, ZCDP(rho="0.4"), PureDP(eps=1),
     r"dataset 1 \('d'\): its logged charges spend rho=0\.9 of its cap ρ ≤ 0\.5 \(zCDP\)"),
], ids=["pure", "zcdp"])
def test_ledger_verify_and_sign_head_refuse_a_log_spent_past_its_cap(
        accountant: Accountant, tmp_path: Any, cap: dict[str, Any], cost: Any, big: Any,
        message: str) -> None:
    from privcal.errors import AuditFailed
    from privcal.storage import signing

    column = "cap_epsilon" if "epsilon" in cap else "cap_rho"
    accountant.create_dataset("d", **cap)
    accountant.charge("d", cost)
    _edit(accountant.ledger, f"UPDATE datasets SET {column} = '100' WHERE name = 'd'")
    accountant.charge("d", big)  # a genuine charge and entry, past the real cap
    _edit(accountant.ledger, f"UPDATE datasets SET {column} = '{next(iter(cap.values()))}' "
                             "WHERE name = 'd'")
    key = tmp_path / "audit.key"
    signing.generate_keypair(key)
    with pytest.raises(AuditFailed, match=message):
        accountant.ledger.verify()
    with pytest.raises(AuditFailed, match=message):
        accountant.ledger.sign_head(key)
    with pytest.raises(AuditFailed, match=message):  # the accountant's says the same
        accountant.verify()


def test_ledger_verify_passes_ledgers_at_their_caps(accountant: Accountant) -> None:
    accountant.create_dataset("p", epsilon=1)
    accountant.charge("p", PureDP(eps="0.5"))
    accountant.charge("p", PureDP(eps="0.5"))  # exactly at the cap
    accountant.create_dataset("z", rho="0.5")
    accountant.charge("z", PureDP(eps="0.6"))  # ρ = 0.18
    accountant.charge("z", ZCDP(rho="0.32"))  # exactly at the cap
    accountant.ledger.verify()
    accountant.verify()
