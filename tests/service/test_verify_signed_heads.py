"""``POST /v1/audit/verify`` takes signed heads with their trusted key, as ``privcal audit
verify --signed-head FILE --trusted-key PUB`` does (red team 18 left it taking bare heads
only): a log that holds the signed head verifies, with ``signed_through``; entries after
it are refused unless ``allow_unsigned_tail``; a head signed by another key, or a log
rewritten under a signed head, answers ``ok: false``; a malformed document or key is 422."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from privcal.costs import ZCDP
from privcal.storage import signing
from tests.service.conftest import Live

pytestmark = pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)


def _verify(live: Live, **body: Any) -> Any:
    with live.client("auditor") as c:
        return c.post("/v1/audit/verify", json=body)


def test_signed_heads_are_checked_over_http(live: Live, tmp_path: Path) -> None:
    priv, pub, _ = signing.generate_keypair(tmp_path / "k")
    other_priv, other_pub, _ = signing.generate_keypair(tmp_path / "other")
    key = Path(pub).read_text()
    live.accountant.charge("d", ZCDP("0.01"))
    signed = live.accountant.ledger.sign_head(priv).model_dump()
    ok = _verify(live, signed_heads=[signed], trusted_key=key)
    assert ok.status_code == 200 and ok.json()["ok"] is True, ok.text
    assert ok.json()["report"]["signed_through"] == signed["seq"]
    live.accountant.charge("d", ZCDP("0.01"))  # an entry after the signed head
    tail = _verify(live, signed_heads=[signed], trusted_key=key).json()
    assert tail["ok"] is False and f"audit entry {signed['seq'] + 1}: not signed" in tail["error"]
    allowed = _verify(live, signed_heads=[signed], trusted_key=key,
                      allow_unsigned_tail=True).json()
    assert allowed["ok"] is True and allowed["report"]["unsigned_entries"] == 1
    # the same head checked with another key, a forged signature: not ok
    wrong = _verify(live, signed_heads=[signed], trusted_key=Path(other_pub).read_text(),
                    allow_unsigned_tail=True).json()
    assert wrong["ok"] is False and "does not verify with the trusted key" in wrong["error"]
    forged = signing.sign_head(live.accountant.ledger.head(), other_priv).model_dump()
    bad = _verify(live, signed_heads=[signed, forged], trusted_key=key).json()
    assert bad["ok"] is False and "does not verify with the trusted key" in bad["error"]


@pytest.mark.parametrize("body,words", [
    ({"signed_heads": [{"seq": 1}], "trusted_key": "x"}, "is not a privcal signed head"),
    ({"signed_heads": [], "trusted_key": "-----BEGIN PUBLIC KEY-----"},
     "go together"),
    ({"signed_heads": [{"seq": 1, "hash": "0" * 64, "time": "t", "key_id": "k",
                        "signature": "s"}]}, "go together"),
    ({"signed_heads": [{"seq": 1, "hash": "0" * 64, "time": "t", "key_id": "k",
                        "signature": "s"}], "trusted_key": "not a key"},
     "is not a PEM public key"),
])
def test_a_malformed_signed_head_or_key_is_422(live: Live, body: dict[str, Any],
                                               words: str) -> None:
    r = _verify(live, **body)
    assert r.status_code == 422 and words in r.json()["detail"], r.text
