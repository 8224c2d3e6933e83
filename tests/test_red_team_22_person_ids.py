"""Red team 22, flows F2, in the Python API: ids from a float column's ``astype(str)``
(``"7.0"``) were charged as other people than ``"7"``; refused now, as in files and on the
service (tests/service/test_red_team_22_ids.py)."""

from __future__ import annotations

import numpy as np
import pytest

from privcal.errors import InvalidInput

SAID = "an integer written as a float"


def test_the_python_api_refuses_ids_from_astype_str(accountant: object) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=2)  # type: ignore[attr-defined]
    ids = np.array([7.0, 8.0, 9.0]).astype(str)  # a float id column, as pandas gives it
    head = acct.ledger.head()  # type: ignore[attr-defined]
    with pytest.raises(InvalidInput, match=rf"subject ids: row 0 is '7\.0', {SAID}"):
        acct.charge_subjects("d", 1, ids)  # type: ignore[attr-defined]
    g = np.random.default_rng(0)
    with pytest.raises(InvalidInput, match=SAID):
        acct.calibrate("ldp-label", dataset="d", probs=g.dirichlet(np.ones(3), 3),  # type: ignore[attr-defined]
                       labels=[0, 1, 2], subjects=ids, alpha=0.2, epsilon=1)
    assert acct.ledger.head() == head  # type: ignore[attr-defined]
    acct.charge_subjects("d", 1, ["7", "v1.0", "7.5", "1.2.3", "00e5"])  # type: ignore[attr-defined]
