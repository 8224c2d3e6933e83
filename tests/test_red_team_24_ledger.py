"""Red team 24, ledger: the SQL ledger against its environment and its storage-level API.

F1: a PostgreSQL server, database or role whose session defaults differ from PostgreSQL's own
(``standard_conforming_strings=off``, a non-ISO ``DateStyle``, a non-UTF8 ``client_encoding``,
all legal ``ALTER DATABASE/ROLE … SET`` choices) made every write or read a driver traceback:
privcal now sets the session settings it relies on, on each of its connections.
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
