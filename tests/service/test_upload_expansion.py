"""A parquet upload whose text columns decode past the service's expansion limit is refused
before it is read: a dictionary-encoded column of one long string is a few KiB on the wire
and megabytes (or gigabytes) of text once decoded, which the file's declared sizes do not
show. Normal uploads (numbers, short repeated ids) are read as before."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
LIMIT = 1 << 20


def _state(lv: Live) -> tuple[Any, ...]:
    return (str(lv.accountant.ledger.head()), lv.accountant.budget("d").spent)


def _dictionary_parquet(values: list[str], rows: int, score: bool = False) -> bytes:
    """``rows`` rows of the ``values`` in turn, dictionary-encoded (never expanded here)."""
    indices = pa.array(np.arange(rows, dtype=np.int32) % len(values))
    cols: dict[str, Any] = {"id": pa.DictionaryArray.from_arrays(indices, pa.array(values))}
    if score:
        cols["score"] = np.linspace(0, 1, rows)
    buf = io.BytesIO()
    pq.write_table(pa.table(cols), buf, compression="zstd")
    return buf.getvalue()


def _post(c: Any, files: dict[str, tuple[str, bytes]], **request: Any) -> Any:
    return c.post("/v1/datasets/d/calibrations", headers={"Idempotency-Key": uuid.uuid4().hex},
                  data={"request": json.dumps({"method": "split", "params": {"alpha": 0.1},
                                               **request})}, files=files)


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The limit lowered to 1 MiB, and a spy on the reader (the specs it was asked for)."""
    import privcal.data.files as files
    import privcal.service.uploads as up

    monkeypatch.setattr(up, "EXPANDED_LIMIT", LIMIT)
    calls: list[str] = []
    real = files.load_array

    def spy(spec: str, *a: Any, **kw: Any) -> Any:
        calls.append(spec)
        return real(spec, *a, **kw)

    monkeypatch.setattr(files, "load_array", spy)
    return calls


def test_a_dictionary_encoded_text_bomb_is_refused_unread(live: Live, limited: list[str]) -> None:
    # 2000 rows of one 4096-character string: 8 MB of text, declared as a few KiB
    bomb = _dictionary_parquet(["x" * 4096], 2000)
    assert len(bomb) < 20_000
    meta = pq.ParquetFile(io.BytesIO(bomb)).metadata
    assert max(meta.row_group(0).total_byte_size, meta.num_rows * 8) < LIMIT  # looks small
    before = _state(live)
    with live.client("analyst") as c:
        r = _post(c, {"scores": ("s.npy", _npy(np.linspace(0, 1, 2000))),
                      "subjects": ("ids.parquet", bomb)})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["type"] == "urn:privcal:problem:invalid-input"
    detail = problem["detail"]
    assert detail.startswith("ids.parquet: the uploaded files expand to more than "
                             f"{LIMIT} bytes"), detail
    assert "\n" not in detail and "/tmp" not in detail and "privcal-upload" not in detail
    assert limited == []  # refused before any file was read
    assert _state(live) == before  # nothing charged, nothing released


def test_a_normal_parquet_upload_is_read(live: Live, limited: list[str],
                                         tmp_path: Path) -> None:
    # numeric scores and short ids, 20 subjects of 40 characters repeated over 2000 rows:
    # 80 KB of ids once decoded, more than the file declares, far under the limit
    ids = [f"subject-{i:032d}" for i in range(20)]
    data = _dictionary_parquet(ids, 2000, score=True)
    path = tmp_path / "calib.parquet"
    path.write_bytes(data)
    from privcal.service.uploads import _expanded_size

    counted = _expanded_size(path)
    assert 2000 * (40 + 8 + 8) <= counted < LIMIT  # every id's text counted, every cell 8 B
    with live.client("analyst") as c:
        r = _post(c, {"scores": ("calib.parquet", data)}, select={"scores": "score"})
    assert r.status_code == 201, r.text
    assert limited and limited[0].endswith("calib.parquet:score")


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()

