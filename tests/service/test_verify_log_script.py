"""``scripts/verify_log.py``: an auditor's own check of the log, without privcal (red team 18,
auditor F4/F7) — against a real server, its saved entries, kept and signed heads, and
tampered copies."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from privcal.accountant.verification import sign_head
from privcal.costs import ZCDP
from privcal.storage.signing import generate_keypair
from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)

_SPEC = importlib.util.spec_from_file_location(
    "verify_log", Path(__file__).parents[2] / "scripts" / "verify_log.py")
assert _SPEC is not None and _SPEC.loader is not None
verify_log: Any = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(verify_log)


def _activity(live: Live) -> None:
    acct = live.accountant
    for i, purpose in enumerate(["plain", "émigré ✓ \u2028 \U0001f600 ！ \\ \" \t", "x" * 300]):
        acct.charge("d", ZCDP(rho=f"0.0{i + 1}"), purpose=purpose)
    acct.calibrate("split", dataset="d", scores=[i / 100 for i in range(100)], alpha=0.1)


@pytest.fixture
def token_file(live: Live, tmp_path: Path) -> Path:
    """Some activity on the live server's ledger, and a file holding an auditor token."""
    _activity(live)
    tok = tmp_path / "auditor.token"
    tok.write_text(live.tokens["auditor"])
    return tok


def test_the_script_agrees_with_privcal(live: Live, tmp_path: Path, token_file: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    tok = token_file
    saved = tmp_path / "entries.json"
    head = str(live.accountant.ledger.head())
    assert verify_log.main(["--url", live.url, "--token-file", str(tok), "--save", str(saved),
                            "--expect-head", head]) == 0
    assert f"head {head}" in capsys.readouterr().out
    entries = json.loads(saved.read_text())
    assert len(entries) == int(head.split(":")[0])
    # pages of two entries give the same log
    assert verify_log.fetch(live.url, live.tokens["auditor"], page=2) == entries
    # a head signed by privcal verifies with the script
    priv, pub, _ = generate_keypair(tmp_path / "k.key", None)
    signed = tmp_path / "head.json"
    signed.write_text(sign_head(live.accountant, priv).model_dump_json())
    assert verify_log.main(["--entries", str(saved), "--signed-head", str(signed),
                            "--trusted-key", str(pub)]) == 0


def test_the_script_catches_what_privcal_catches(live: Live, tmp_path: Path, token_file: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "entries.json"
    assert verify_log.main(["--url", live.url, "--token-file", str(token_file),
                            "--save", str(saved)]) == 0
    entries = json.loads(saved.read_text())
    head = f"{entries[-1]['seq']}:{entries[-1]['entry_hash']}"

    def verdict(rows: list[dict[str, Any]], *args: str) -> tuple[int, str]:
        p = tmp_path / "t.json"
        p.write_text(json.dumps(rows))
        code = verify_log.main(["--entries", str(p), *args])
        return code, capsys.readouterr().err

    edited = [dict(e) for e in entries]
    k = next(i for i, e in enumerate(edited) if '"rho":"0.02"' in e["payload"])
    edited[k]["payload"] = edited[k]["payload"].replace('"0.02"', '"0.002"')
    assert verdict(edited) == (4, f"FAILED: entry {k + 1}: the hash does not match its "
                                  "payload\n")
    # the newest entry removed: consistent on its own, caught by the kept head
    assert verdict(entries[:-1])[0] == 0
    code, err = verdict(entries[:-1], "--expect-head", head)
    assert code == 4 and f"entry {len(entries)}: missing" in err
    respaced = [dict(e) for e in entries]
    respaced[1]["payload"] = respaced[1]["payload"].replace(":", ": ", 1)
    assert verdict(respaced) == (4, "FAILED: entry 2: the payload is not RFC 8785 text\n")
    gap = entries[:1] + entries[2:]
    assert verdict(gap)[0] == 4


def test_ordinary_mistakes_are_one_line(live: Live, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Red team 19 (newcomer F5): a non-auditor token or a mistyped URL printed a traceback."""
    analyst = tmp_path / "analyst.token"
    analyst.write_text(live.tokens["analyst"])
    shaped = tmp_path / "shaped.json"
    shaped.write_text('[{"seq": 1}]')  # JSON, but not entries (the review: a traceback)
    bad = tmp_path / "bad.token"
    bad.write_text(live.tokens["auditor"][:-4] + "AAAA")
    cases = [(["--url", live.url, "--token-file", str(analyst)],
              f"error: {live.url} answered 403 Forbidden: this needs an auditor's"),
             (["--url", live.url, "--token-file", str(bad)],
              f"error: {live.url} answered 401 Unauthorized: the token is not valid"),
             (["--url", live.url + "x", "--token-file", str(analyst)],
              f"error: cannot read the log from {live.url}x: "),
             (["--url", live.url, "--token-file", str(tmp_path / "none")],
              f"error: {tmp_path / 'none'}: No such file or directory"),
             (["--entries", str(analyst)], f"error: {analyst}: not a JSON list of entries"),
             (["--entries", str(shaped)], f"error: {shaped}: not a list of privcal audit"),
             (["--url", live.url + "/healthz#", "--token-file", str(analyst)],
              f"error: cannot read the log from {live.url}/healthz#: its answer is not a page")]
    for argv, said in cases:
        assert verify_log.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == 1, (argv, err)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda e: e.__setitem__("payload", e["payload"].replace('"data":{', '"data":{"x":NaN,', 1)),
     "not an entry of a privcal log (ValueError"),
    (lambda e: e.__setitem__("payload", e["payload"].replace('"data":{', '"data":{"x":1.5,', 1)),
     "not an entry of a privcal log (ValueError"),
    (lambda e: e.__setitem__("payload", 5), "not an entry of a privcal log (TypeError"),
    (lambda e: e.__setitem__("payload", "nope"), "not an entry of a privcal log (JSONDecodeError"),
    (lambda e: e.__setitem__("prev_hash", "zz"), "not an entry of a privcal log (ValueError"),
    (lambda e: e.__setitem__("payload", "[]"), "the payload is not a JSON object"),
    (lambda e: e.__setitem__("payload", "[" * 100_000 + "]" * 100_000),
     "not an entry of a privcal log (RecursionError"),
])
def test_a_malformed_entry_is_a_log_that_does_not_verify(
        live: Live, tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str],
        edit: Any, said: str) -> None:
    """Red team 20, service F5: an entry a dishonest server serves in a form no privcal log
    has (NaN or a float in its payload, a payload that is not text or not an object, a
    prev_hash that is not hex) ended the auditor's script in a traceback, exit 1; it is a
    log that does not verify: FAILED naming the entry, exit 4."""
    saved = tmp_path / "entries.json"
    assert verify_log.main(["--url", live.url, "--token-file", str(token_file),
                            "--save", str(saved)]) == 0
    entries = json.loads(saved.read_text())
    edit(entries[2])
    saved.write_text(json.dumps(entries))
    capsys.readouterr()
    assert verify_log.main(["--entries", str(saved)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("FAILED: entry 3: ") and said in err, err


def test_a_malformed_head_is_one_line(ledger_url: str, tmp_path: Path,  # (the module's mark)
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Red team 21, service F6: a malformed --expect-head, a signed-head file that is not one
    (not JSON, a field missing, a seq that is text) or a trusted key that is not a key was a
    traceback (exit 1, no verdict); it is one line naming it, exit 1."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    entries = tmp_path / "e.json"
    entries.write_text("[]")
    pub = tmp_path / "k.pub"
    pub.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    base = ["--entries", str(entries)]
    cases: list[tuple[list[str], str]] = [
        ([*base, "--expect-head", "abc"], "error: --expect-head 'abc': not SEQ:HASH"),
        ([*base, "--expect-head", "1:" + "0" * 63], "error: --expect-head"),
    ]
    heads = {"text": "not json",
             "partial": json.dumps({"format": "privcal-signed-head-v1", "seq": 0,
                                    "hash": "0" * 64, "time": "x"}),
             "seq_text": json.dumps({"format": "privcal-signed-head-v1", "seq": "0",
                                     "hash": "0" * 64, "time": "x", "signature": "AA=="})}
    for name, text in heads.items():
        head = tmp_path / f"{name}.json"
        head.write_text(text)
        cases.append(([*base, "--signed-head", str(head), "--trusted-key", str(pub)],
                      f"error: {head}: not a privcal signed head"))
    cases.append(([*base, "--signed-head", str(tmp_path / "text.json"), "--trusted-key",
                   str(entries)], f"error: {entries}: not a PEM public key"))
    for argv, said in cases:
        assert verify_log.main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith(said) and err.count("\n") == 1, (argv, err)
    assert verify_log.main([*base, "--expect-head", "0:" + "0" * 64]) == 0  # the empty log
