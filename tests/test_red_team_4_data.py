"""Red team, session 10: data files and ids that changed what was calibrated or charged.
Each test is an attack that used to record a false guarantee or overspend a cap; it passes
when the attack fails (refused with one line, nothing written).

- a CSV written by pandas without column names (``Series.to_csv(index=False)``: header
  ``0``; an unnamed DataFrame: ``0,1,…``) had its header read as a data row: 18 scores
  calibrated as 19 (a fake score 0), a coverage ≥ 0.9 recorded where the truth is 17/19;
- subject ids written with ``", "`` separators (``" 7"``) or in another Unicode
  normalisation (NFD ``café``) were new people to the ledger: each person spent ε0 twice
  past the per-subject cap.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import text

from privcal.cli import main
from privcal.data.files import load_array, load_reports
from privcal.errors import InvalidInput

PANDAS = "what pandas writes as a header"
BLANK = "with a blank at its start or end"
NFD_CAFE = unicodedata.normalize("NFD", "café")


def _written(acct: Any) -> tuple[int, ...]:
    """Charges, audit entries, releases and per-subject spend rows in the ledger."""
    with acct.ledger.engine.connect() as conn:
        return tuple(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar())
                     for t in ("charges", "audit_log", "releases", "subject_spend"))


def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _one_error_line(res: Any, *needles: str) -> None:
    assert res.exit_code == 1, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert res.stdout == ""


# ------------------------------------------------------------------ pandas' default header
@pytest.mark.parametrize(("content", "shown"), [
    ("0\n1.0\n2.0\n3.0\n", "'0'"),  # pd.Series(...).to_csv(index=False)
    ("0,1\n0.9,0.1\n0.8,0.2\n", "'0,1'"),  # an unnamed DataFrame: itself a probability row
    ("\n0 , 1,2\n0.2,0.3,0.5\n", "'0 , 1,2'"),  # blank lines and blanks around cells
    (",".join(map(str, range(10))) + "\n" + ",".join(["0.1"] * 10) + "\n", "'0,1,…,9'"),
])
def test_a_pandas_default_header_is_refused_by_the_loader(tmp_path: Path, content: str,
                                                          shown: str) -> None:
    f = tmp_path / "x.csv"
    f.write_text(content)
    for kwargs in ({}, {"matrix": True}, {"ids": True}, {"shape_only": True}):
        with pytest.raises(InvalidInput) as err:
            load_array(str(f), "scores", **kwargs)  # type: ignore[arg-type]
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{f}: its first row {shown} is {PANDAS}")
        assert "give the columns names" in msg


def test_pandas_written_files_are_refused_and_named_ones_read(tmp_path: Path) -> None:
    import pandas as pd
    pd.Series(np.arange(1, 19, dtype=float)).to_csv(tmp_path / "s.csv", index=False)
    pd.DataFrame(np.array([[0.9, 0.1], [0.3, 0.7]])).to_csv(tmp_path / "p.csv", index=False)
    for name in ("s.csv", "p.csv"):
        with pytest.raises(InvalidInput, match=PANDAS):
            load_array(str(tmp_path / name), "scores", matrix=name == "p.csv")
    # what the message asks for: a named Series / DataFrame
    pd.Series(np.arange(1, 19, dtype=float), name="score").to_csv(tmp_path / "n.csv",
                                                                 index=False)
    assert load_array(str(tmp_path / "n.csv"), "scores").tolist() == list(range(1, 19))
    pd.DataFrame(np.array([[0.9, 0.1], [0.3, 0.7]]), columns=["a", "b"]).to_csv(
        tmp_path / "m.csv", index=False)
    assert load_array(str(tmp_path / "m.csv"), "probs", matrix=True).shape == (2, 2)


def test_other_first_rows_are_read_as_before(tmp_path: Path) -> None:
    def read(content: str, **kw: Any) -> list[Any]:
        f = tmp_path / "y.csv"
        f.write_text(content)
        return np.asarray(load_array(str(f), "scores", **kw)).tolist()

    # refused now, read as data before (so this test fails without the fix)
    with pytest.raises(InvalidInput, match=PANDAS):
        read("0\n1\n")
    assert read("score\n0\n1\n") == [0, 1]  # a named header stays a header
    assert read("1\n2\n3\n") == [1, 2, 3]  # headerless numbers stay data
    assert read("0.0\n1\n") == [0.0, 1.0]  # "0.0" is not pandas' header
    # 1,0 is a reordered frame's header (red team 16: six sets for five rows), refused;
    # other number rows stay data
    with pytest.raises(InvalidInput, match=PANDAS):
        read("1,0\n0.5,0.5\n", matrix=True)
    assert read("0.9,0.1\n0.5,0.5\n", matrix=True) == [[0.9, 0.1], [0.5, 0.5]]
    assert read("1,1\n0.5,0.5\n", matrix=True) == [[1, 1], [0.5, 0.5]]
    assert read("0,0\n1,1\n", matrix=True) == [[0, 0], [1, 1]]
    assert read("00\n1\n") == [0, 1]
    assert read("7\n8\n", ids=True) == ["7", "8"]
    assert read(",0\n0,0.5\n1,0.25\n") == [0.5, 0.25]  # to_csv() with the index: a header


def test_session_reports_and_service_uploads_refuse_a_pandas_header(tmp_path: Path) -> None:
    (tmp_path / "r.csv").write_text("0,1\n7,1\n8,0\n")
    with pytest.raises(InvalidInput, match=PANDAS):
        load_reports(str(tmp_path / "r.csv"), "subject", "bit")
    from privcal.service.uploads import CalibrationBody, CalibrationInput, load_arrays

    body = CalibrationBody.model_validate_json('{"method":"split","params":{"alpha":0.1}}')
    upload = CalibrationInput(body, {"scores": ("scores.csv", b"0\n1.0\n2.0\n3.0\n")})
    with pytest.raises(InvalidInput, match=f"^scores.csv: its first row '0' is {PANDAS}"):
        load_arrays(upload, shape_only=False)


def test_cli_refuses_a_pandas_header_and_charges_nothing(ledger_url: str,
                                                         tmp_path: Path) -> None:
    assert _cli(ledger_url, "db", "upgrade").exit_code == 0
    assert _cli(ledger_url, "dataset", "create", "d", "--epsilon", "10",
                "--allow-nonprivate").exit_code == 0
    (tmp_path / "s.csv").write_text("0\n" + "\n".join(f"{i}.0" for i in range(1, 19)) + "\n")
    (tmp_path / "t.csv").write_text("0\n" + "\n".join(f"{i}.0" for i in range(1, 19)) + "\n")
    (tmp_path / "f.csv").write_text("0\n" + "0.0\n" * 18)
    split = ["calibrate", "split", "--dataset", "d", "--alpha", "0.1"]
    before = _cli(ledger_url, "budget", "show", "d", "--json").stdout
    _one_error_line(_cli(ledger_url, *split, "--scores", str(tmp_path / "s.csv")),
                    f"s.csv: its first row '0' is {PANDAS}")
    _one_error_line(_cli(ledger_url, *split, "--score", "absolute", "--preds",
                         str(tmp_path / "f.csv"), "--targets", str(tmp_path / "t.csv")), PANDAS)
    _one_error_line(_cli(ledger_url, *split, "--dry-run", "--scores",
                         str(tmp_path / "s.csv")), PANDAS)
    assert _cli(ledger_url, "budget", "show", "d", "--json").stdout == before
    assert '"charges": 0' in before
    # named, the same scores calibrate on their 18 rows
    (tmp_path / "n.csv").write_text("score\n" + "\n".join(f"{i}.0" for i in range(1, 19)))
    res = _cli(ledger_url, *split, "--scores", str(tmp_path / "n.csv"), "--json")
    assert res.exit_code == 0, res.stderr
    assert '"n": 18' in res.stdout


# ------------------------------------------------------------------ ids that read as others
BAD_IDS = [(" 7", BLANK), ("7 ", BLANK), ("\t7", BLANK), (NFD_CAFE, "not in Unicode NFC")]


@pytest.mark.parametrize(("bad", "why"), BAD_IDS)
def test_charge_subjects_refuses_ids_that_read_as_another(accountant: Any, bad: str,
                                                          why: str) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=1)
    accountant.charge_subjects("d", 1, ["7", "café", "8"])
    before = _written(accountant)
    with pytest.raises(InvalidInput) as err:
        accountant.charge_subjects("d", 1, ["9", bad])
    msg = str(err.value)
    assert "\n" not in msg and "row 1" in msg and why in msg
    assert _written(accountant) == before
    assert accountant.subject_spend("d", "9") == 0
    # a person at the cap is refused under one spelling only
    assert not accountant.charge_subjects("d", 1, ["7"], refuse_if_none=False).accepted_mask[0]


@pytest.mark.parametrize(("bad", "why"), BAD_IDS)
def test_local_dp_calibrate_refuses_ids_that_read_as_another(accountant: Any, bad: str,
                                                             why: str) -> None:
    accountant.create_dataset("d", epsilon=1, subject_epsilon=2)
    rng = np.random.default_rng(1)
    probs, y = rng.dirichlet(np.ones(3), size=300), rng.integers(0, 3, size=300)
    users = [f"u{i}" for i in range(300)]
    users[5] = bad
    before = _written(accountant)
    with pytest.raises(InvalidInput, match=f"subject ids: row 5 is .*{why}"):
        accountant.calibrate("ldp-label", dataset="d", alpha=0.2, epsilon=1, probs=probs,
                             labels=y, subjects=users)
    assert _written(accountant) == before


@pytest.mark.parametrize("sep", [", ", ",", "nfd"])
def test_cli_refuses_ids_with_blanks_or_not_nfc(ledger_url: str, tmp_path: Path,
                                                sep: str) -> None:
    assert _cli(ledger_url, "db", "upgrade").exit_code == 0
    assert _cli(ledger_url, "dataset", "create", "d", "--epsilon", "100",
                "--subject-epsilon", "1").exit_code == 0
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(3), size=200).tolist()
    y = rng.integers(0, 3, size=200).tolist()
    ids = [f"{NFD_CAFE}{i}" if sep == "nfd" else str(i) for i in range(200)]
    rows = [f"{a!r},{b!r},{1 - a - b!r},{lab},{i}" for (a, b, _), lab, i in zip(p, y, ids,
                                                                            strict=True)]
    body = "p0,p1,p2,label,id\n" + "\n".join(rows) + "\n"
    f = tmp_path / "run.csv"
    f.write_text(body.replace(",", ", ") if sep == ", " else body)
    if sep == ",":  # 7 and " 7 ": the same person written two ways
        f.write_text(body.replace(",7\n", ", 7 \n"))
    before = _cli(ledger_url, "budget", "show", "d", "--json").stdout
    res = _cli(ledger_url, "calibrate", "ldp-label", "--dataset", "d", "--alpha", "0.2",
               "--epsilon", "1", "--probs", str(f), "--columns", "p0:p2", "--labels",
               f"{f}:label", "--subjects", f"{f}:id")
    why = "not in Unicode NFC" if sep == "nfd" else BLANK
    row = 7 if sep == "," else 0
    _one_error_line(res, f"run.csv: subjects: row {row} is", why)
    after = _cli(ledger_url, "budget", "show", "d", "--json").stdout
    assert after == before and '"charges": 0' in after


def test_a_delta_encoded_text_column_is_refused_with_a_way_out(tmp_path: Path) -> None:
    """pyarrow cannot read a DELTA_BYTE_ARRAY column as dictionaries: the size check said
    "cannot read it (OSError: Not yet implemented …)"; it names the encoding and the way out,
    and decodes nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from privcal.service.upload_limits import parquet_decoded_size

    path = tmp_path / "subjects.parquet"
    table = pa.table({"subject": [f"patient-{i:05d}" for i in range(1000)],
                      "score": np.linspace(0, 1, 1000)})
    pq.write_table(table, path, use_dictionary=False,
                   column_encoding={"subject": "DELTA_BYTE_ARRAY"})
    with pytest.raises(InvalidInput, match=r"'subject' is delta-encoded.*dictionary or plain"):
        parquet_decoded_size(path, 1 << 30)
