"""Red team 21, flows M1: ``privcal token create --role device --subjects FILE`` read FILE as
raw lines, while ``calibrate --subjects`` and ``session submit --reports`` read a table: the
same subjects.csv gave device tokens to ``subject`` (its header) and to ``"Smith, J"`` (the CSV
quotes kept), while the calibrations charge ``Smith, J`` — one person under two ids, each with
its own per-subject cap (Σε0 = 2 against a cap of 1)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.cli import main
from privcal.storage import Ledger
from privcal.storage.tokens import list_tokens


def _ledger(tmp_path: Path) -> tuple[str, Accountant]:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    led = Ledger(url)
    led.upgrade()
    acct = Accountant(led)
    acct.create_dataset("d", epsilon=1, subject_epsilon=1)  # each person: Σε0 ≤ 1
    return url, acct


def _session(acct: Accountant) -> int:
    return S.open_session(acct, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=2,
                          group_size=2).id


def test_device_tokens_from_a_subjects_csv_name_the_people_calibrate_reads(
        tmp_path: Path) -> None:
    url, acct = _ledger(tmp_path)
    subs = tmp_path / "subjects.csv"
    subs.write_text('subject\nalice\n"Smith, J"\n')  # what pandas' to_csv writes
    rep = tmp_path / "r.csv"
    rep.write_text('subject,bit,round\n"Smith, J",1,0\nalice,0,0\n')
    first = _session(acct)
    r = CliRunner().invoke(main, ["--db-url", url, "--json", "session", "submit", str(first),
                                  "--reports", str(rep)])
    assert r.exit_code == 0, r.output
    assert acct.subject_spend("d", "Smith, J") == Decimal(1)  # at the cap
    second = _session(acct)
    r = CliRunner().invoke(main, ["--db-url", url, "--json", "token", "create", "--role",
                                  "device", "--session", str(second), "--subjects", str(subs)])
    assert r.exit_code == 0, r.output
    assert sorted(row["subject"] for row in json.loads(r.stdout)) == ["Smith, J", "alice"]
    assert sorted(t.subject for t in list_tokens(acct.ledger) if t.subject) == [
        "Smith, J", "alice"]
    # the device of Smith, J reports through its token's subject: over the cap, refused
    got = S.submit_reports(acct, second, ["Smith, J"], [1], [0])
    assert got.accepted == 0
    assert acct.subject_spend("d", "Smith, J") == Decimal(1)
    acct.ledger.close()


def test_a_table_column_and_a_plain_list(tmp_path: Path) -> None:
    """``FILE:COLUMN`` of a multi-column table names that column's ids; a plain list is one
    id per line; a plain line with a double quote is refused, naming the line, and no token
    is made."""
    url, acct = _ledger(tmp_path)
    sid = _session(acct)
    (tmp_path / "t.csv").write_text("subject,bit,round\nbob,1,0\ncarol,0,0\n")
    (tmp_path / "plain.txt").write_text("dave\n\nSmith, J\n")
    (tmp_path / "quoted.txt").write_text('erin\n"Smith, J"\n')
    base = ["--db-url", url, "--json", "token", "create", "--role", "device", "--session",
            str(sid), "--subjects"]
    r = CliRunner().invoke(main, [*base, f"{tmp_path / 't.csv'}:subject"])
    assert r.exit_code == 0, r.output
    assert [row["subject"] for row in json.loads(r.stdout)] == ["bob", "carol"]
    r = CliRunner().invoke(main, [*base, str(tmp_path / "plain.txt")])
    assert r.exit_code == 0, r.output
    assert [row["subject"] for row in json.loads(r.stdout)] == ["dave", "Smith, J"]
    before = len(list_tokens(acct.ledger))
    r = CliRunner().invoke(main, [*base, str(tmp_path / "quoted.txt")])
    assert r.exit_code == 1 and "line 2" in r.output and "double quote" in r.output, r.output
    assert len(list_tokens(acct.ledger)) == before
    # red team 22, flows F2: what pandas' Series.to_csv(header=False) writes of an integer id
    # column with a missing value — the table readers' rule, on the plain list too
    (tmp_path / "floats.txt").write_text("6\n\n7.0\n8.0\n")
    r = CliRunner().invoke(main, [*base, str(tmp_path / "floats.txt")])
    assert r.exit_code == 1, r.output
    assert "line 3 is '7.0', an integer written as a float" in json.loads(r.stdout)[
        "error"]["message"]
    assert len(list_tokens(acct.ledger)) == before
    acct.ledger.close()


def test_an_early_stopped_session_says_the_reports_it_used(tmp_path: Path) -> None:
    """L1: a 6-round session whose round 5 stopped within the band recorded "data n=1200"
    (the plan's T·n′, which its guarantee is for) and nothing of the 1 000 reports it stored
    and charged; its release now says ``reports_used`` and ``release show`` prints both."""
    import numpy as np

    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("d", epsilon=1, subject_epsilon=20)
    a = S.open_session(acct, "ldp-score", dataset="d", alpha=0.5, epsilon=8, rounds=6,
                       group_size=200)
    rng = np.random.default_rng(1)
    k = 0
    while (info := S.session_status(acct, a.id)).status == "open":
        bits = (rng.random(200) <= info.query).astype(int)
        S.submit_reports(acct, a.id, [f"u{k}_{i}" for i in range(200)], bits.tolist(),
                         [info.round] * 200)
        k += 1
    rel = acct.release(S.session_status(acct, a.id).release_id)
    used = rel.diagnostics["reports_used"]
    assert rel.diagnostics["rounds_used"] < 6 and rel.shape["n"] == 1200  # stopped early
    assert used == 200 * rel.diagnostics["rounds_used"] == acct.subject_summary("d").subjects
    res = CliRunner().invoke(main, ["--db-url", url, "release", "show", str(rel.id)])
    assert res.exit_code == 0 and f"{used} reports used" in res.output, res.output
    acct.ledger.close()


def test_a_numbers_header_spelling_the_class_names_is_named(tmp_path: Path) -> None:
    """Red team 21, readme F4: a --probs CSV headed "1,2,3" — the release's own class names,
    as scikit-learn's ``classes_ = [1, 2, 3]`` writes them — over the probabilities alone was
    read as a row of data: "row 0 sums to 6". ``predict`` and ``evaluate`` now say what the
    line is and what to do; without it the file is taken in the class order."""
    import numpy as np

    g = np.random.default_rng(5)
    p = g.dirichlet(np.ones(3), size=1000)
    y = (p.cumsum(axis=1) < g.random((1000, 1))).sum(axis=1) + 1
    rows = "".join(",".join(repr(float(v)) for v in r) + f",{lab}\n"
                   for r, lab in zip(p, y, strict=True))
    (tmp_path / "calib.csv").write_text("1,2,3,label\n" + rows)
    body = "".join(",".join(repr(float(v)) for v in r) + "\n" for r in p[:50])
    (tmp_path / "new.csv").write_text("1,2,3\n" + body)
    (tmp_path / "plain.csv").write_text(body)
    np.save(tmp_path / "labels.npy", y[:50])
    url = f"sqlite:///{tmp_path / 'l.db'}"
    run = CliRunner().invoke
    assert run(main, ["--db-url", url, "dataset", "create", "d", "--rho", "1"]).exit_code == 0
    res = run(main, ["--db-url", url, "calibrate", "pcoqs", "--dataset", "d", "--alpha", "0.2",
                     "--rho", "0.5", "--probs", str(tmp_path / "calib.csv"), "--label-column",
                     "label", "--score", "lac"])
    assert res.exit_code == 0, res.output
    for cmd in (["predict"], ["evaluate", "--labels", str(tmp_path / "labels.npy")]):
        res = run(main, ["--db-url", url, *cmd, "--release", "1", "--probs",
                         str(tmp_path / "new.csv")])
        assert res.exit_code == 1 and "its first line '1,2,3' spells the release's class" \
            in res.output and "sums to" not in res.output, res.output
        res = run(main, ["--db-url", url, *cmd, "--release", "1", "--probs",
                         str(tmp_path / "plain.csv")])
        assert res.exit_code == 0, res.output


def test_an_interrupted_quickstart_removes_its_ledger_and_says_so(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Readme F5: Ctrl-C in `privcal quickstart` said "a calibration's charge is kept …
    (`privcal audit report` lists it)" — of a ledger the newcomer does not have — and left
    its /tmp/privcal-quickstart-* directory; a closed pipe (`| head -1`) exited 1 silently,
    leaving it too. Now the directory is removed and the line says so (exit 130); a closed
    pipe ends quietly with 141, as a shell reports a writer cut off."""
    import glob
    import subprocess
    import sys
    import tempfile

    import privcal.cli.quickstart_cmds as qs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real = qs._step

    def interrupted(n: int, *a: Any, **kw: Any) -> None:
        if n == 3:
            raise KeyboardInterrupt
        real(n, *a, **kw)

    monkeypatch.setattr(qs, "_step", interrupted)
    res = CliRunner().invoke(main, ["quickstart"])
    assert res.exit_code == 130, res.output
    assert "the demo's throw-away ledger was removed; nothing else was touched" in res.output
    assert "audit report" not in res.output
    assert glob.glob(str(tmp_path / "privcal-quickstart-*")) == []
    exe = str(Path(sys.executable).with_name("privcal"))
    env = {**__import__("os").environ, "TMPDIR": str(tmp_path)}
    got = subprocess.run(["bash", "-c", f"'{exe}' quickstart 2>'{tmp_path}/err' | head -1 "
                          ">/dev/null; echo ${PIPESTATUS[0]}"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert got.stdout.strip() == "141" and (tmp_path / "err").read_text() == ""
    assert glob.glob(str(tmp_path / "privcal-quickstart-*")) == []
