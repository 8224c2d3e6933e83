"""``privcal token create|list|revoke`` and ``privcal serve`` as a real process."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from privcal.cli import main


def _run(url: str, *args: str) -> Any:
    r = CliRunner().invoke(main, ["--db-url", url, *args])
    return r


def test_token_cli_shows_once_stores_hash_and_revokes(ledger: Any, ledger_url: str) -> None:
    from privcal.storage.tokens import ApiToken

    r = _run(ledger_url, "token", "create", "--role", "admin", "--name", "root", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    tok = doc["token"]
    m = re.fullmatch(r"pcl_([0-9a-f]{16})_([A-Za-z0-9_-]{43})", tok)
    assert m and m.group(1) == doc["id"]
    with ledger.read() as s:
        row = s.get(ApiToken, doc["id"])
        assert row.secret_sha256 == hashlib.sha256(m.group(2).encode()).hexdigest()
        assert m.group(2) not in str([getattr(row, c) for c in ("id", "name", "role")])
    listed = _run(ledger_url, "token", "list", "--json")
    assert listed.exit_code == 0 and tok not in listed.output and m.group(2) not in listed.output
    assert json.loads(listed.stdout)[0]["role"] == "admin"
    from privcal.storage.tokens import authenticate

    assert authenticate(ledger, tok) is not None
    assert _run(ledger_url, "token", "revoke", doc["id"]).exit_code == 0
    assert authenticate(ledger, tok) is None
    bad = _run(ledger_url, "token", "create", "--role", "device", "--session", "1")
    assert bad.exit_code == 1 and "device tokens need subject" in bad.output
    bad = _run(ledger_url, "token", "create", "--role", "analyst", "--dataset", "nope")
    assert bad.exit_code == 1 and "unknown dataset" in bad.output
    bad = _run(ledger_url, "token", "create", "--role", "admin", "--expires", "soon")
    assert bad.exit_code == 1 and "--expires" in bad.output
    ok = _run(ledger_url, "token", "create", "--role", "auditor", "--expires", "2h", "--json")
    assert json.loads(ok.stdout)["info"]["expires_at"] is not None


def test_token_create_count_makes_one_device_token_per_subject(accountant: Any,
                                                              ledger_url: str,
                                                              tmp_path: Path) -> None:
    from privcal.accountant.sessions import open_session
    from privcal.storage.tokens import authenticate, list_tokens

    accountant.create_dataset("d", rho="1", subject_epsilon="10")
    sid = open_session(accountant, "ldp-score", dataset="d", alpha=0.2, epsilon=1.0, rounds=1,
                       group_size=5, requester="t").id
    led = accountant.ledger
    r = _run(ledger_url, "token", "create", "--role", "device", "--session", str(sid),
             "--count", "5", "--subject-prefix", "phone-", "--expires", "2h", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["subject"] for x in rows] == [f"phone-{i}" for i in range(5)]
    for x in rows:
        got = authenticate(led, x["token"])
        assert got is not None and (got.id, got.role, got.session, got.subject) == (
            x["id"], "device", sid, x["subject"])
        assert got.expires_at is not None
    listed = _run(ledger_url, "token", "list", "--json").stdout
    assert all(x["token"] not in listed for x in rows)  # shown once: only the hash is kept

    # a subjects file (blank lines skipped), printed as SUBJECT<TAB>TOKEN lines
    f = tmp_path / "devices.txt"
    f.write_text("watch a\n\nwatch b\n", encoding="utf-8")
    r = _run(ledger_url, "token", "create", "--role", "device", "--session", str(sid),
             "--subjects", str(f))
    assert r.exit_code == 0, r.output
    lines = [ln.split("\t") for ln in r.stdout.splitlines()]
    assert [a for a, _ in lines] == ["watch a", "watch b"]
    assert [authenticate(led, t).subject for _, t in lines] == ["watch a", "watch b"]
    assert "shown only now" in r.stderr and lines[0][1] not in r.stderr

    before = {t.id for t in list_tokens(led)}
    bad_calls = [
        (["--role", "analyst", "--count", "2", "--subject-prefix", "p"], "device tokens"),
        (["--role", "device", "--count", "2", "--subject-prefix", "p"], "need --session"),
        (["--role", "device", "--session", str(sid), "--count", "2"], "exactly one of"),
        (["--role", "device", "--session", str(sid), "--subject-prefix", "p"], "needs --count"),
        (["--role", "device", "--session", str(sid), "--count", "2", "--subject-prefix", "p",
          "--subject", "x"], "--subject cannot be used"),
        (["--role", "device", "--session", str(sid), "--count", "3", "--subjects", str(f)],
         "holds 2 ids"),
        (["--role", "device", "--session", str(sid), "--subjects", str(tmp_path / "none")],
         "cannot read it"),
        (["--role", "device", "--session", "999", "--count", "2", "--subject-prefix", "p"],
         "unknown session"),
        (["--role", "device", "--session", str(sid), "--count", "0", "--subject-prefix", "p"],
         "--count"),
    ]
    for args, msg in bad_calls:
        r = _run(ledger_url, "token", "create", *args)
        assert r.exit_code != 0 and msg in r.output, (args, r.output)
        assert "Traceback" not in r.output
    assert {t.id for t in list_tokens(led)} == before  # refused: none stored


def _spawn(url: str, tmp: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PRIVCAL_DATABASE_URL": url}
    proc = subprocess.Popen([sys.executable, "-c", "from privcal.cli import main; main()",
                             "serve", "--port", "0", "--log-level", "warning"],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    return proc, line


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_serve_refuses_a_stale_schema(ledger_url: str, tmp_path: Path) -> None:
    from privcal.storage import Ledger

    led = Ledger(ledger_url)
    led.upgrade("0002")
    led.close()
    proc, line = _spawn(ledger_url, tmp_path)
    rest = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=60) == 5
    assert "privcal db upgrade" in line + rest


def test_serve_port_zero_and_readyz_when_the_ledger_goes(ledger: Any, ledger_url: str,
                                                          tmp_path: Path) -> None:
    proc, line = _spawn(ledger_url, tmp_path)
    try:
        m = re.fullmatch(r"listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert m, line
        base = m.group(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(base + "/readyz")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["schema"] == ledger.head_revision()
        ledger.downgrade("0002")  # the ledger goes stale under the running server
        r = httpx.get(base + "/readyz")
        assert r.status_code == 503 and r.json()["type"].endswith("schema-out-of-date")
        assert httpx.get(base + "/healthz").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)
