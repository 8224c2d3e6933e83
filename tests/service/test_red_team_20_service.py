"""Red team 20, service F1: a score option JSON cannot hold exactly (a whole number past
2**53 − 1) was a 500 on session open and on calibrate — the release or the request digest
failed to be written — and, through the Python API, a P-COQS run was charged first. Now a
422 naming the option, and nothing is charged or written."""

from __future__ import annotations

import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

BIG = 10**40


def _written(lv: Live) -> tuple[int, int, int]:
    b = lv.accountant.budget("d")
    return b.charges, b.releases, lv.accountant.verify().entries


@pytest.mark.parametrize("options", [{"lam": BIG}, {"lam": 2**60}, {"k_reg": 2**53}])
def test_a_score_option_json_cannot_hold_is_a_422_that_writes_nothing(
        live: Live, options: dict[str, int]) -> None:
    before = _written(live)
    probs = [[0.5, 0.5]] * 50
    with live.client("analyst") as c:
        for method, params in (("pcoqs", {"alpha": 0.1, "rho": 0.1}), ("split", {"alpha": 0.1})):
            r = c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": method},
                       json={"method": method, "params": params, "probs": probs,
                             "labels": [0, 1] * 25, "score": "raps", "score_options": options})
            assert r.status_code == 422, r.text
            assert "2**53 − 1" in r.json()["detail"]
        r = c.post("/v1/datasets/d/sessions", headers={"Idempotency-Key": "s"}, json={
            "method": "ldp-score", "alpha": 0.1, "epsilon": 2, "rounds": 3, "group_size": 50,
            "score": "raps", "score_options": options})
        assert r.status_code == 422, r.text
        assert "2**53 − 1" in r.json()["detail"]
        assert c.get("/v1/datasets/d").status_code == 200  # the connection still serves
    assert _written(live) == before


def test_a_label_mondrian_dry_run_reads_the_class_names_as_the_run_does(live: Live) -> None:
    """Red team 20, coverage F3: an upload whose header names the classes, with name
    labels, and label groups — ``?dry_run=true`` said 422 "labels must be numeric" where the
    run answered 201. Now the dry run prices what the run then charges."""
    import io
    import json
    import uuid

    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    g = np.random.default_rng(0)
    p = g.dirichlet(np.ones(3), size=3000)
    y = np.array([g.choice(3, p=q) for q in p])
    names = ["cat", "dog", "emu"]
    buf = io.BytesIO()
    pcsv.write_csv(pa.table({**{nm: p[:, j] for j, nm in enumerate(names)},
                             "label": np.array(names)[y]}), buf)
    req = {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.5}, "score": "lac",
           "label_column": "label", "mondrian": "label", "public_groups": True}
    got = {}
    with live.client("analyst") as c:
        for dry in (True, False):
            r = c.post("/v1/datasets/d/calibrations" + ("?dry_run=true" if dry else ""),
                       data={"request": json.dumps(req)},
                       files={"probs": ("calib.csv", buf.getvalue())},
                       headers={"Idempotency-Key": uuid.uuid4().hex})
            assert r.status_code == (200 if dry else 201), r.text
            got[dry] = r.json()
    assert got[True]["guarantee"] == got[False]["coverage"]["statement"]
    assert got[True]["cost"] == got[False]["privacy"]["cost"]
