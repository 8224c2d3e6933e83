"""``GET /v1/releases/{id}`` reads a release once (red team 17, R7): the principal's test of
its dataset is passed to ``Accountant.release`` (``visible``), which answers NotFound for a
release it rejects before comparing the row with its audit entry; the route read it
unchecked first, then again checked."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal import Accountant
from privcal.errors import AuditFailed, NotFound


def test_a_release_invisible_to_the_caller_is_not_found_before_it_is_checked(
        ledger: Any) -> None:
    """``GET /v1/releases/{id}`` reads the release once, with the principal's visibility
    test: a release of a dataset it may not see is 'unknown', not refused (which would say
    that it exists), even when its row was edited."""
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    scores = np.random.default_rng(0).random(200)
    ids = [acct.calibrate("split", dataset="d", scores=scores[: 100 + i], alpha=0.1).id
           for i in range(2)]
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE releases SET threshold = '0.5' WHERE id = :i"), {"i": ids[0]})
    with pytest.raises(NotFound, match=rf"^unknown release {ids[0]}$"):
        acct.release(ids[0], visible=lambda name: name != "d")
    with pytest.raises(AuditFailed, match=rf"^release {ids[0]} refused"):
        acct.release(ids[0], visible=lambda name: name == "d")
    assert acct.release(ids[1], visible=lambda name: name == "d").id == ids[1]
