"""Red team 25, service: an uploaded CSV is bounded by its width, and a replay the library
finds is answered as a replay.

F2: pyarrow's CSV reader holds about 10 KiB per column whatever the rows, and the upload
limit counted a CSV as its own size: one 8 MiB line of ``0,0,0,…`` (4 million columns)
grew the server past 10 GB before any answer (and, under an address-space limit, pyarrow's
``std::bad_alloc`` aborted the process). A CSV upload now counts
``uploads.CSV_COLUMN_COST`` bytes per column of its first line against the 1 GiB limit of
uploads (at most 65 536 columns): past it, a one-line 422 before the table is read.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import Live

SQLITE = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def _state(lv: Live) -> tuple[Any, ...]:
    return (str(lv.accountant.ledger.head()), lv.accountant.budget("d").spent)


@pytest.fixture
def read_specs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A spy on the reader: the specs it was asked for."""
    import privcal.data.files as files

    calls: list[str] = []
    real = files.load_array

    def spy(spec: str, *a: Any, **kw: Any) -> Any:
        calls.append(spec)
        return real(spec, *a, **kw)

    monkeypatch.setattr(files, "load_array", spy)
    return calls


def _post(c: Any, name: str, data: bytes, query: str = "") -> Any:
    return c.post(f"/v1/datasets/d/calibrations{query}",
                  headers={"Idempotency-Key": uuid.uuid4().hex},
                  data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1}})},
                  files={"scores": (name, data)})


@SQLITE
@pytest.mark.parametrize("query", ["", "?dry_run=true"])
def test_f2_a_csv_wider_than_the_bound_is_refused_unread(
        live: Live, read_specs: list[str], monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    """With the limit at 1 MiB (64 columns of 16 KiB), a 100-column CSV line is refused
    before the reader is called, one line naming its width and the limit; nothing written."""
    import privcal.service.uploads as up

    monkeypatch.setattr(up, "EXPANDED_LIMIT", 1 << 20)
    wide = b",".join([b"0.5"] * 100) + b"\n"
    before = _state(live)
    with live.client("analyst") as c:
        r = _post(c, "wide.csv", wide, query)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("wide.csv: 100 columns: the uploaded files take more than "
                             f"{1 << 20} bytes once read"), detail
    assert "\n" not in detail and len(detail) < 300
    assert read_specs == []  # refused before the file was read
    assert _state(live) == before


def test_f2_the_real_bound_counts_a_wide_line_without_splitting_it(tmp_path: Path) -> None:
    """An 8 MiB line of 4 194 305 cells — the upload that grew the server past 10 GB — is
    sized past the 1 GiB limit from its commas (it was counted as its 8 MiB)."""
    from privcal.service.uploads import CSV_COLUMN_COST, EXPANDED_LIMIT, _expanded_size

    path = tmp_path / "scores.csv"
    path.write_bytes(b"\n  \n" + b"0," * (4 * 1024 * 1024) + b"0\n1\n")
    assert _expanded_size(path) == path.stat().st_size + (4 * 1024 * 1024 + 1) * CSV_COLUMN_COST
    assert _expanded_size(path) > EXPANDED_LIMIT
    assert EXPANDED_LIMIT // CSV_COLUMN_COST == 65_536


@SQLITE
def test_f2_a_csv_within_the_bound_is_read(live: Live, read_specs: list[str]) -> None:
    """A narrow CSV (one column, 50 rows) is read and calibrated as before."""
    data = b"score\n" + b"".join(b"%.3f\n" % (i / 50) for i in range(50))
    with live.client("analyst") as c:
        r = _post(c, "calib.csv", data)
    assert r.status_code == 201, r.text
    assert read_specs and read_specs[0].endswith("calib.csv")


def _npz(members: int) -> bytes:
    """An ``.npz`` of ``members`` empty float arrays (stored, not deflated)."""
    import io
    import zipfile

    import numpy as np

    one = io.BytesIO()
    np.save(one, np.zeros(0))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for i in range(members):
            z.writestr(f"a{i}.npy", one.getvalue())
    return buf.getvalue()


@SQLITE
def test_f4_an_npz_of_more_arrays_than_the_bound_is_refused_unread(
        live: Live, read_specs: list[str]) -> None:
    """F4: np.load read every member (70 000 empty ones: 7.5 s), and the 422 named them all
    (479 KB). Past NPZ_MAX_MEMBERS (1000) the upload is refused before it is read."""
    import privcal.service.uploads as up

    NPZ_MAX_MEMBERS = 1000  # (up.NPZ_MAX_MEMBERS, checked last)
    before = _state(live)
    with live.client("analyst") as c:
        r = _post(c, "many.npz", _npz(NPZ_MAX_MEMBERS + 1), "?dry_run=true")
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == (f"many.npz: {NPZ_MAX_MEMBERS + 1} arrays; the service reads "
                                  f"an .npz of at most {NPZ_MAX_MEMBERS} (a calibration reads "
                                  "one a part)")
    assert read_specs == []
    assert _state(live) == before
    with live.client("analyst") as c:  # a few arrays, one selected: read as before
        r = c.post("/v1/datasets/d/calibrations?dry_run=true",
                   headers={"Idempotency-Key": uuid.uuid4().hex},
                   data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1},
                                                "select": {"scores": "a1"}})},
                   files={"scores": ("few.npz", _npz(3))})
    assert r.status_code == 422, r.text  # (empty arrays: the library's own one-line refusal)
    assert read_specs and read_specs[0].endswith("few.npz:a1")
    assert getattr(up, "NPZ_MAX_MEMBERS", None) == NPZ_MAX_MEMBERS


@SQLITE
def test_f4_a_problem_detail_is_cut_to_a_bounded_length(live: Live) -> None:
    """A refusal naming every column of a 3000-column table (60 KB) is sent cut to
    DETAIL_CHARS characters, ending in an ellipsis."""
    import privcal.service.problems as problems

    DETAIL_CHARS = 2000  # (problems.DETAIL_CHARS, checked last)
    header = b",".join(b"a_column_named_%05d" % i for i in range(3000)) + b"\n"
    table = header + b",".join([b"0.5"] * 3000) + b"\n"
    with live.client("analyst") as c:
        r = c.post("/v1/datasets/d/calibrations?dry_run=true",
                   headers={"Idempotency-Key": uuid.uuid4().hex},
                   data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1},
                                                "select": {"scores": "nope"}})},
                   files={"scores": ("t.csv", table)})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("t.csv: no column named 'nope' (has: a_column_named_00000, ")
    assert len(detail) == DETAIL_CHARS and detail.endswith("…")
    assert getattr(problems, "DETAIL_CHARS", None) == DETAIL_CHARS


def _lose_the_record(lv: Live, key: str) -> None:
    """The service's record of ``key``'s answer removed, as if the server died between the
    ledger's commit and that record (README "Retries": the retry gets the library's replay)."""
    from sqlalchemy import MetaData, Table, delete

    engine = lv.accountant.ledger.engine
    table = Table("idempotency_records", MetaData(), autoload_with=engine)
    with engine.begin() as conn:
        assert conn.execute(delete(table).where(table.c.key == key)).rowcount == 1


def test_f1_a_library_replay_is_answered_as_a_replay(live: Live) -> None:
    """F1: a calibration or a session open whose service record was lost was answered 201
    (a new release, a new session) when the library replayed it, and a charge 200 without
    ``Idempotent-Replayed``. Each is now 200 with the header, the same id, nothing new
    (SQLite and PostgreSQL)."""
    import numpy as np

    scores = np.random.default_rng(5).random(400).tolist()
    asks = [
        ("/v1/datasets/d/calibrations", {"method": "pcoqs", "params": {"alpha": 0.1, "rho": 0.05},
                                         "scores": scores}, "id"),
        ("/v1/datasets/d/calibrations", {"method": "split", "params": {"alpha": 0.1},
                                         "scores": scores}, "id"),  # non-private: release_keys
        ("/v1/datasets/d/charges", {"cost": {"rho": "0.01"}}, "charge_id"),
        ("/v1/datasets/d/sessions", {"method": "ldp-score", "alpha": 0.2, "epsilon": 1.0,
                                     "rounds": 2, "group_size": 4}, "id"),
    ]
    with live.client("analyst") as c:
        for i, (path, body, id_key) in enumerate(asks):
            key = f"lost-{i}"
            first = c.post(path, json=body, headers={"Idempotency-Key": key})
            assert first.status_code == 201, first.text
            assert "idempotent-replayed" not in first.headers
            before = _state(live)
            _lose_the_record(live, key)
            again = c.post(path, json=body, headers={"Idempotency-Key": key})
            assert again.status_code == 200, (path, again.status_code, again.text[:200])
            assert again.headers.get("idempotent-replayed") == "true", path
            assert again.json()[id_key] == first.json()[id_key]
            assert _state(live) == before  # nothing charged or written in the ledger's log
            third = c.post(path, json=body, headers={"Idempotency-Key": key})  # the service's
            assert (third.status_code, third.headers.get("idempotent-replayed")) == (200, "true")
            assert third.json()[id_key] == first.json()[id_key]
        fresh = c.post(asks[2][0], json=asks[2][1], headers={"Idempotency-Key": "new-one"})
        assert fresh.status_code == 201 and "idempotent-replayed" not in fresh.headers


@SQLITE
def test_f5_an_ingestor_batch_is_parsed_off_the_event_loop(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """F5: FastAPI parsed and validated a batch body on the event loop (330 000 rows held
    every other request 3.2 s). Its JSON is now parsed in a worker thread; the answer and a
    row's 422 are as before."""
    import asyncio

    import privcal.service.json_body as jb
    from tests.service.conftest import open_ldp

    on_loop: list[bool] = []
    real = jb.loads_strict

    def spy(raw: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real(raw)

    monkeypatch.setattr(jb, "loads_strict", spy)
    sid = open_ldp(live, group_size=50, rounds=1)
    ing = live.token("ingestor", session=sid)
    on_loop.clear()  # (the session open's body: parsed on the loop, as every small body)
    rows = [{"subject": f"s{i}", "value": i % 2, "round": 0} for i in range(9000)]
    with live.client(token=ing) as c:
        bad = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b0"},
                     json={"reports": [*rows[:5000], {"subject": "x", "value": 1, "round": -1},
                                       *rows[5000:]]})
        assert bad.status_code == 422, bad.text
        assert bad.json()["errors"][0]["loc"] == ["body", "reports", 5000, "round"]
        r = c.post(f"/v1/sessions/{sid}/batches", headers={"Idempotency-Key": "b1"},
                   json={"reports": rows})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 50 and r.json()["rejected"] == 8950
    assert on_loop and not any(on_loop), on_loop
