"""Red team 26, api F6: ``Agent.send`` checked the agent's scores, then read them again to
compute its message; a list changed in between (another thread of the agent's program) sent
a message from scores that were never checked. Fails before the fix (checked by reverting
it): the message was computed from the changed list."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import privcal.client
from privcal.accountant.sessions import score as session_score
from privcal.client import Agent
from tests.service.conftest import Live, open_fed


def test_f6_an_agent_sends_the_message_of_the_scores_it_checked(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    sid = open_fed(live, agents=3)
    tok = live.token("agent", session=sid, agent="h1")
    scores = list(np.random.default_rng(0).random(200))
    first = np.array(scores)
    check = session_score.check_agent_scores

    def checked_then_changed(params: Any, s: Any) -> None:
        check(params, s)
        scores[:] = [0.999] * len(scores)  # the program's other thread, after the check

    seen: list[np.ndarray] = []
    message = privcal.client.fedcp2_qq_message

    def spy(s: Any, plan: Any, rng: Any = None) -> Any:
        seen.append(np.array(s, dtype=float))
        return message(s, plan, rng)

    monkeypatch.setattr(session_score, "check_agent_scores", checked_then_changed)
    monkeypatch.setattr(privcal.client, "fedcp2_qq_message", spy)
    assert Agent(live.url, tok).send(scores)["status"] == "accepted"
    assert len(seen) == 1 and np.array_equal(seen[0], first)
