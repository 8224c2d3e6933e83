"""Red team 11 (embedding an app in privcal), findings fixed here:

- F6: a NumPy masked array (masked = missing) was calibrated on silently with the hidden
  values under its mask (``np.asarray`` drops the mask): 500 of 1000 scores masked gave a
  release with n = 1000 and the masked sentinel as threshold (pcoqs too, charged), and
  ``Release.predict_set`` used masked probabilities. Now any masked entry is refused with
  one line naming the input and how many entries are masked (scores, probabilities, labels,
  targets, ids, session values and rounds, an Agent's scores), before anything is charged
  or written; a masked array with nothing masked is its data.
- F7: ``Reporter.report(nan)`` randomized and *sent* a report; ``report("0.3x")`` /
  ``report(None)`` raised raw ValueError/TypeError; the documented
  ``report(lambda q: score <= q)`` was refused for a NumPy score (its ``np.bool_`` is not a
  bool). Now a value that is not a real number (or NaN, or a bool) is refused before
  anything is asked of the server, NumPy bools and 0/1 are truths, and a function
  returning anything else is refused with nothing drawn or sent.
- F9: an ``httpx.AsyncClient`` given as ``client=`` failed with a raw AttributeError and
  "coroutine was never awaited"; now a one-line InvalidInput when the object is made.
- F10: a list of subject ids passed where an amount belongs was echoed in full in the error
  (100 000 ids, 1.5 MB); now a container is named by its type and length only, and any
  other value's text is cut at 40 characters.
- F12: ``repr()``/``str()`` of a new token (``NewToken``) showed its bearer secret.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import numpy as np
import pytest

from privcal import Accountant, Ledger
from privcal.accountant import sessions as S
from privcal.calibrators.validation import (
    check_labels,
    check_probs,
    check_scores,
    check_targets,
    id_strings,
)
from privcal.client import Agent, Reporter
from privcal.errors import InvalidInput
from privcal.storage import tokens

RNG = np.random.default_rng(11)
N = 400
PROBS = RNG.dirichlet(np.ones(3), N)
LABELS = RNG.integers(0, 3, N)


def _one_line(exc: pytest.ExceptionInfo[InvalidInput]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _masked(a: np.ndarray, every: int = 2) -> np.ma.MaskedArray:
    mask = np.zeros(a.shape, dtype=bool)
    mask.reshape(-1)[::every] = True
    return np.ma.masked_array(a, mask=mask)


# --- F6: masked arrays -------------------------------------------------------------------

@pytest.mark.parametrize("check, data, what", [
    (check_scores, RNG.random(N), "scores"),
    (check_targets, RNG.random(N), "targets"),
    (check_probs, PROBS, "probabilities"),
    (lambda a: check_labels(a, 3), LABELS, "labels"),
    (id_strings, np.arange(N), "ids"),
])
def test_a_masked_entry_is_refused_and_an_unmasked_masked_array_is_its_data(
        check: Any, data: np.ndarray, what: str) -> None:
    m = _masked(data, every=4)
    with pytest.raises(InvalidInput) as exc:
        check(m)
    msg = _one_line(exc)
    assert msg.startswith(f"{what}: {int(m.mask.sum())} of {m.size} entries are masked")
    plain = check(np.ma.masked_array(data, mask=np.zeros(data.shape, dtype=bool)))
    assert type(plain) is np.ndarray and np.array_equal(plain, check(data))


def _world() -> Accountant:
    acct = Accountant("sqlite://")
    acct.create_dataset("d", rho=10, subject_epsilon=5, allow_nonprivate=True)
    return acct


def _state(acct: Accountant) -> tuple[Any, int]:
    return acct.budget("d").model_dump(), len(acct.releases("d"))


def test_masked_scores_are_not_calibrated_on_and_nothing_is_charged() -> None:
    acct = _world()
    data = np.where(np.arange(1000) < 500, RNG.random(1000) * 0.1, 99.0)
    masked = np.ma.masked_array(data, mask=data == 99.0)
    before = _state(acct)
    for method, kw in [("split", {}), ("pcoqs", {"rho": 0.1})]:
        with pytest.raises(InvalidInput, match="scores: 500 of 1000 entries are masked"):
            acct.calibrate(method, dataset="d", scores=masked, alpha=0.1, **kw)
    assert _state(acct) == before
    # the control: the same call with a plain array is charged
    acct.calibrate("pcoqs", dataset="d", scores=data, alpha=0.1, rho=0.1)
    assert _state(acct) != before


@pytest.mark.parametrize("which", ["probs", "labels"])
@pytest.mark.parametrize("method, kw", [("pcoqs", {"rho": 0.1, "score": "lac"}),
                                        ("split", {"score": "aps"})])
def test_masked_probabilities_or_labels_are_refused_before_any_charge(
        which: str, method: str, kw: dict[str, Any]) -> None:
    acct = _world()
    arrays: dict[str, Any] = {"probs": PROBS, "labels": LABELS}
    arrays[which] = _masked(arrays[which], every=3)
    before = _state(acct)
    with pytest.raises(InvalidInput, match="entries are masked"):
        acct.calibrate(method, dataset="d", alpha=0.1, **arrays, **kw)
    assert _state(acct) == before


def test_masked_regression_targets_are_refused() -> None:
    acct = _world()
    f = RNG.random(N)
    before = _state(acct)
    with pytest.raises(InvalidInput, match="entries are masked"):
        acct.calibrate("pcoqs", dataset="d", preds=f, targets=_masked(f + 0.1), score="absolute",
                       score_range=(0, 5), alpha=0.1, rho=0.1)
    assert _state(acct) == before


def test_predict_set_refuses_masked_probabilities() -> None:
    acct = _world()
    rel = acct.calibrate("split", dataset="d", probs=PROBS, labels=LABELS, score="lac",
                         alpha=0.1)
    m = np.ma.masked_array(PROBS[:3], mask=np.ones((3, 3), dtype=bool))
    with pytest.raises(InvalidInput, match="probabilities: 9 of 9 entries are masked"):
        rel.predict_set(m)
    assert np.array_equal(rel.predict_set(np.ma.masked_array(PROBS[:3])),
                          rel.predict_set(PROBS[:3]))


@pytest.mark.parametrize("which", ["values", "rounds"])
def test_session_values_or_rounds_with_a_masked_entry_are_refused_and_nothing_stored(
        which: str) -> None:
    acct = _world()
    sess = S.open_session(acct, "ldp-score", dataset="d", alpha=0.1, epsilon=1, rounds=2,
                          group_size=50)
    ids = ["a", "b", "c"]
    batch = {"values": np.array([0, 1, 1]), "rounds": np.array([0, 0, 0])}
    # the hidden entry is a well-formed bit / the current round: without the mask check it
    # would be stored as a report
    batch[which] = np.ma.masked_array(batch[which], mask=[False, True, False])
    with pytest.raises(InvalidInput, match=f"{which}: 1 of 3 entries are masked"):
        S.submit_reports(acct, sess.id, ids, batch["values"], batch["rounds"])
    again = S.submit_reports(acct, sess.id, ids, [0, 1, 1], [0, 0, 0])
    assert again.accepted == 3  # none of them was stored by the refused batch


def test_federated_messages_with_a_masked_entry_are_refused_and_nothing_stored() -> None:
    acct = _world()
    sess = S.open_session(acct, "fedcp-qq", dataset="d", alpha=0.2, agents=3, local_n=50)
    values = np.ma.masked_array([0.5, 0.7, 0.9], mask=[False, True, False])
    with pytest.raises(InvalidInput, match="values: 1 of 3 entries are masked"):
        S.submit_reports(acct, sess.id, ["h1", "h2", "h3"], values)
    again = S.submit_reports(acct, sess.id, ["h1", "h2", "h3"], [0.5, 0.7, 0.9])
    assert again.accepted == 3  # none of them was stored by the refused batch


# --- F7 / F9: the HTTP client --------------------------------------------------------------

class _Fake:
    """An in-process ldp-score server (httpx.MockTransport) that records every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.sent: list[dict[str, Any]] = []

    def handle(self, req: httpx.Request) -> httpx.Response:
        self.requests.append(req)
        if req.url.path == "/v1/whoami":
            return httpx.Response(200, json={"role": "device", "session": 1, "subject": "alice",
                                             "reported_rounds": [], "within_cap": True})
        if req.url.path == "/v1/sessions/1" and req.method == "GET":
            return httpx.Response(200, json={"id": 1, "method": "ldp-score", "status": "open",
                                             "round": 1, "rounds": 10, "query": 0.5,
                                             "params": {"epsilon": 1.0}})
        if req.method == "PUT":
            self.sent.append(json.loads(req.content))
            return httpx.Response(201, json={"status": "accepted"})
        return httpx.Response(404, json={"detail": "no"})

    def client(self) -> httpx.Client:
        return httpx.Client(base_url="https://calib.example",
                            transport=httpx.MockTransport(self.handle))


def _report(value: Any) -> tuple[_Fake, dict[str, Any] | InvalidInput]:
    fake = _Fake()
    try:
        out: dict[str, Any] | InvalidInput = Reporter(
            "https://calib.example", "tok", client=fake.client()).report(value)
    except InvalidInput as exc:
        assert "\n" not in str(exc)
        out = exc
    return fake, out


def test_a_report_value_must_be_a_real_number_refused_before_anything_is_asked() -> None:
    for bad in [float("nan"), np.float32("nan"), None, "0.3x", "0.3", True, np.bool_(False),
                [0.3], b"1"]:
        fake, out = _report(bad)
        assert isinstance(out, InvalidInput) and "report() takes a score" in str(out), bad
        assert fake.requests == [], bad  # nothing asked of the server, nothing drawn
    for score in [0.3, np.float32(0.3), np.int64(0), float("-inf"), float("inf"), 10 ** 400]:
        fake, out = _report(score)
        assert isinstance(out, dict) and out["status"] == "accepted", score
        assert len(fake.sent) == 1


def test_a_value_function_returns_a_truth_numpy_bools_and_0_1_included() -> None:
    for truth in [lambda q: np.float32(0.3) <= q, lambda q: np.float64(0.9) <= q,
                  lambda q: np.int64(1), lambda q: 0, lambda q: True]:
        fake, out = _report(truth)
        assert isinstance(out, dict) and out["status"] == "accepted"
        assert len(fake.sent) == 1
    for ret in [float("nan"), None, 0.5, 2, "yes", np.array([True]), np.float64(1.0)]:
        fake, out = _report(lambda q, ret=ret: ret)
        assert isinstance(out, InvalidInput) and "must return true/false" in str(out), ret
        assert fake.sent == [], ret


def test_an_agent_refuses_masked_scores_before_anything_is_asked() -> None:
    fake = _Fake()
    with pytest.raises(InvalidInput, match="scores: 2 of 4 entries are masked"):
        Agent("https://calib.example", "tok", client=fake.client()).send(
            np.ma.masked_array([0.1, 0.2, 9.0, 9.0], mask=[0, 0, 1, 1]))
    assert fake.requests == []


@pytest.mark.parametrize("cls", [Reporter, Agent])
def test_an_async_client_is_refused_in_one_line(cls: Any) -> None:
    async def make() -> None:
        async with httpx.AsyncClient(base_url="https://calib.example") as ac:
            cls("https://calib.example", "tok", client=ac)

    with pytest.raises(InvalidInput, match=r"synchronous httpx\.Client.*asyncio\.to_thread") as exc:
        asyncio.run(make())
    _one_line(exc)


# --- F10: amounts' errors never echo a container -------------------------------------------

def test_ids_given_as_an_amount_are_not_echoed() -> None:
    acct = Accountant("sqlite://")
    acct.create_dataset("d", epsilon=10, subject_epsilon=3)
    ids = [f"MRN-{i:07d}" for i in range(100_000)]
    with pytest.raises(InvalidInput) as exc:
        acct.charge_subjects("d", ids, 1.0)  # type: ignore[arg-type]  # ε0 and ids swapped
    msg = _one_line(exc)
    assert msg == "ε0 must be a number, got a list of 100000 items"
    for bad, shown in [(ids[:3], "a list of 3 items"), ({"patient": "MRN-0000042"},
                                                        "a dict of 1 items")]:
        with pytest.raises(InvalidInput) as exc:
            acct.create_dataset("x", rho=bad)  # type: ignore[arg-type]
        assert "MRN" not in str(exc.value) and shown in str(exc.value)


@pytest.mark.parametrize("bad", ["MRN-" + "7" * 5000, "9" * 5000, "-" + "9" * 5000])
def test_a_long_amount_text_is_cut(bad: str) -> None:
    acct = Accountant("sqlite://")
    with pytest.raises(InvalidInput) as exc:
        acct.create_dataset("x", rho=bad)  # type: ignore[arg-type]
    assert len(_one_line(exc)) < 120


# --- F12: a new token's repr hides its secret ----------------------------------------------

def test_a_new_tokens_repr_and_str_hide_the_secret() -> None:
    led = Ledger("sqlite://")
    Accountant(led)
    tok = tokens.create_token(led, "admin", name="ops")
    assert tok.token.startswith("pcl_")
    for text in (repr(tok), str(tok), f"{tok}", repr([tok])):
        assert tok.token not in text and tok.id in text
    assert tok.model_dump()["token"] == tok.token
    assert json.loads(tok.model_dump_json())["token"] == tok.token
