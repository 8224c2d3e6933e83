"""Red team 24, service F1: ``privcal token create`` reads an empty option as malformed, never
as "not given" (an empty --expires minted a token that never expires)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from privcal.cli import main


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args])


def _tokens(url: str) -> list[Any]:
    r = _run(url, "token", "list", "--json")
    assert r.exit_code == 0, r.output
    return list(json.loads(r.stdout))


def test_f1_an_empty_expires_is_refused_not_a_token_that_never_expires(
        ledger: Any, ledger_url: str) -> None:
    """``--expires "$TTL"`` with TTL unset: refused like ``--expires 0s``, nothing created."""
    before = _tokens(ledger_url)
    bad = _run(ledger_url, "token", "create", "--role", "auditor", "--expires", "")
    assert bad.exit_code == 1, bad.output
    assert "--expires must be a positive duration" in bad.output
    assert _tokens(ledger_url) == before


def test_f1_bulk_device_tokens_refuse_an_empty_expires_and_an_empty_name(
        accountant: Any, ledger_url: str) -> None:
    from privcal.accountant.sessions import open_session

    accountant.create_dataset("sub", epsilon="1", subject_epsilon="2")
    sid = open_session(accountant, "ldp-score", dataset="sub", alpha=0.1, epsilon=1.0,
                       rounds=2, group_size=5).id
    before = _tokens(ledger_url)
    bulk = ("token", "create", "--role", "device", "--session", str(sid), "--count", "2",
            "--subject-prefix", "p-")
    bad = _run(ledger_url, *bulk, "--expires", "")
    assert bad.exit_code == 1 and "--expires must be a positive duration" in bad.output
    named = _run(ledger_url, *bulk, "--name", "")
    assert named.exit_code == 1, named.output
    assert "--name cannot be used with --count/--subjects" in named.output
    assert _tokens(ledger_url) == before
