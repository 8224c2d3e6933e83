"""Red team 26, upgrade: state written by an older privcal and used by the installed one.

F1: FedCP-QQ 1.3.0 / FedCP²-QQ 1.4.0 added the parameter ``agents_planned`` (default None:
what the versions before did). Every idempotent request digests ``params.model_dump()``,
so a keyed request recorded before that upgrade digests without the key and the same
request now digests with ``"agents_planned": null``. Its retry after the upgrade was
refused as "a different charge or request … use a new key" — and a new key charges every
agent again for one request (a run charged but not released could not be completed by its
key). Reproduced with the real older privcal (git 4e7264c~1, CLI ``calibrate fedcp2-qq``,
``calibrate fedcp-qq`` and ``session open fedcp2-qq`` under a key, then ``db upgrade`` and
the same commands); here the older privcal's digest is reproduced by hashing the request as
it was then: the same request without ``agents_planned`` and without the requester (bound
into digests only later, f29aeb3).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import privcal.accountant.normalize as normalize
from privcal import Accountant, Ledger
from privcal.accountant import sessions as S
from privcal.errors import InvalidInput

RNG = np.random.default_rng(26)
AGENTS = np.repeat(np.arange(10), 500)
SCORES = RNG.random(AGENTS.size)


def _as_before(request: dict[str, Any]) -> dict[str, Any]:
    """A request as privcal before ``agents_planned`` (and before the requester) hashed it."""
    params = request.get("params")
    out = {k: v for k, v in request.items() if k != "requester"}
    if isinstance(params, dict):
        out["params"] = {k: v for k, v in params.items() if k != "agents_planned"}
    return out


@pytest.fixture
def old_digests(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A context in which requests are digested as the privcal before the upgrade did."""
    original = normalize.request_digest

    class Older:
        def __enter__(self) -> None:
            monkeypatch.setattr(normalize, "request_digest",
                                lambda request: original(_as_before(request)))

        def __exit__(self, *exc: object) -> None:
            monkeypatch.setattr(normalize, "request_digest", original)

    yield Older()


@pytest.fixture
def acct(tmp_path: Any) -> Iterator[Accountant]:
    led = Ledger(f"sqlite:///{tmp_path / 'l.sqlite'}")
    a = Accountant(led)
    a.create_dataset("d", epsilon=10, subject_epsilon=5, allow_nonprivate=True)
    yield a
    led.close()


def test_a_keyed_fedcp2_qq_run_from_before_agents_planned_replays_not_charged_twice(
        acct: Accountant, old_digests: Any) -> None:
    with old_digests:
        first = acct.calibrate("fedcp2-qq", dataset="d", alpha=0.1, epsilon=1, scores=SCORES,
                               agents=AGENTS, idempotency_key="k1", requester="ana")
    spent = acct.budget("d").charges
    again = acct.calibrate("fedcp2-qq", dataset="d", alpha=0.1, epsilon=1, scores=SCORES,
                           agents=AGENTS, idempotency_key="k1", requester="ana")
    assert again.id == first.id and again.threshold == first.threshold
    assert acct.budget("d").charges == spent and len(acct.releases("d")) == 1
    # still bound: another request, or another requester, under the key is refused
    with pytest.raises(InvalidInput, match="idempotency key 'k1' was already used"):
        acct.calibrate("fedcp2-qq", dataset="d", alpha=0.2, epsilon=1, scores=SCORES,
                       agents=AGENTS, idempotency_key="k1", requester="ana")
    with pytest.raises(InvalidInput, match="idempotency key 'k1' was already used"):
        acct.calibrate("fedcp2-qq", dataset="d", alpha=0.1, epsilon=1, scores=SCORES,
                       agents=AGENTS, idempotency_key="k1", requester="bob")
    assert acct.budget("d").charges == spent and len(acct.releases("d")) == 1


def test_a_keyed_non_private_fedcp_qq_run_from_before_agents_planned_replays(
        acct: Accountant, old_digests: Any) -> None:
    with old_digests:
        first = acct.calibrate("fedcp-qq", dataset="d", alpha=0.1, scores=SCORES,
                               agents=AGENTS, idempotency_key="q1", requester="ana")
    again = acct.calibrate("fedcp-qq", dataset="d", alpha=0.1, scores=SCORES, agents=AGENTS,
                           idempotency_key="q1", requester="ana")
    assert again.id == first.id and len(acct.releases("d")) == 1
    for other in ({"alpha": 0.2, "requester": "ana"}, {"alpha": 0.1, "requester": "bob"}):
        with pytest.raises(InvalidInput, match="idempotency key 'q1' was already used"):
            acct.calibrate("fedcp-qq", dataset="d", scores=SCORES, agents=AGENTS,
                           idempotency_key="q1", **other)
    assert len(acct.releases("d")) == 1


def test_a_keyed_session_open_from_before_agents_planned_replays(
        acct: Accountant, old_digests: Any) -> None:
    kw: dict[str, Any] = dict(dataset="d", alpha=0.1, epsilon=1, agents=10, local_n=500,
                              idempotency_key="o1", requester="ana")
    with old_digests:
        first = S.open_session(acct, "fedcp2-qq", **kw)
    again = S.open_session(acct, "fedcp2-qq", **kw)
    assert again.id == first.id
    with pytest.raises(InvalidInput, match="idempotency key 'o1' was already used"):
        S.open_session(acct, "fedcp2-qq", **{**kw, "requester": "bob"})
    with pytest.raises(InvalidInput, match="idempotency key 'o1' was already used"):
        S.open_session(acct, "fedcp2-qq", **{**kw, "alpha": 0.2})
