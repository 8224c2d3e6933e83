"""The idempotency key of a non-private calibration is bound (migration 0010, ``release_keys``).

A key binds a charged request through its charge. A non-private release (split on an
``--allow-nonprivate`` dataset) charges nothing, so its key bound nothing: a retry in the
library or the CLI recorded a second release, another request under the same key ran without
a word, and the HTTP service, which bound it only in its own record written after the release,
calibrated again when a server died in between (red team 12, r12crash F5). Now the key, the
request's digest and the release are written in the release's own transaction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import inspect, text

from privcal import Accountant, Ledger
from privcal.cli import main
from privcal.costs import PureDP
from privcal.errors import InvalidInput

S = np.random.default_rng(0).random(500)


def _split(acct: Any, key: str | None, alpha: float = 0.1, n: int = 500) -> Any:
    return acct.calibrate("split", dataset="d", scores=S[:n], alpha=alpha,
                          idempotency_key=key)


def test_a_keyed_non_private_run_is_recorded_once(accountant: Any) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    first = _split(acct, "k")
    assert _split(acct, "k") == first  # a retry: the same release, not a second
    # another request under the key — level, or the data's public shape — is refused, and
    # records nothing
    for alpha, n in ((0.2, 500), (0.1, 400)):
        with pytest.raises(InvalidInput, match=r"idempotency key 'k' was already used for a "
                                               r"different request \(release \d+, a "
                                               r"non-private calibration\)"):
            _split(acct, "k", alpha, n)
    # a key a charge of the dataset holds is another request's too
    acct.charge("d", PureDP(eps=0.1), idempotency_key="c")
    with pytest.raises(InvalidInput, match="idempotency key 'c' was already used"):
        _split(acct, "c")
    assert [r.id for r in acct.releases("d")] == [first.id]
    # keys are per dataset, and a run without a key is recorded each time, as before
    acct.create_dataset("e", epsilon=1, allow_nonprivate=True)
    other = acct.calibrate("split", dataset="e", scores=S, alpha=0.1, idempotency_key="k")
    assert other.id != first.id
    assert _split(acct, None).id != _split(acct, None).id
    assert acct.verify().releases == 4


def test_the_cli_replays_a_keyed_split_and_refuses_another_request(
        ledger: object, ledger_url: str, tmp_path: Path) -> None:
    np.save(tmp_path / "s.npy", S)
    run = CliRunner()

    def cli(*args: str) -> Any:
        return run.invoke(main, ["--db-url", ledger_url, *args])

    assert cli("dataset", "create", "d", "--epsilon", "1", "--allow-nonprivate").exit_code == 0
    base = ["calibrate", "split", "--dataset", "d", "--scores", str(tmp_path / "s.npy"),
            "--idempotency-key", "job-1", "--json"]
    ids = []
    for _ in range(2):
        out = cli(*base, "--alpha", "0.1")
        assert out.exit_code == 0, out.output
        ids.append(json.loads(out.stdout)["release"]["id"])
    assert ids[0] == ids[1]
    bad = cli(*base[:-1], "--alpha", "0.2")  # without --json: the one-line error
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1, bad.output
    assert "idempotency key 'job-1' was already used for a different request" in bad.output
    listed = cli("release", "list", "--dataset", "d", "--json")
    assert listed.exit_code == 0, listed.output
    assert [r["id"] for r in json.loads(listed.stdout)] == [ids[0]]


def test_migration_0010_adds_the_table_and_its_downgrade_drops_it(ledger_url: str) -> None:
    ledger = Ledger(ledger_url)
    ledger.upgrade()
    acct = Accountant(ledger)
    acct.create_dataset("d", epsilon=1, allow_nonprivate=True)
    first = _split(acct, "k")
    ledger.downgrade("0009")
    assert "release_keys" not in inspect(ledger.engine).get_table_names()
    assert ledger.upgrade("0010") == "0010"
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM release_keys")).scalar() == 0
    assert ledger.upgrade() == ledger.head_revision()  # (0011 after it)
    # the binding written before the downgrade is gone with the table: a retry now records
    # a second release (what every release made before 0010 was), then binds the key again
    again = _split(acct, "k")
    assert again.id != first.id and _split(acct, "k") == again
    assert acct.verify().releases == 2
    ledger.close()
