"""Red team 7, the run (finding B-2): ``Accountant.run`` charged every subject (local DP) or
agent (FedCP²-QQ) ε0 and only then let ``calibrate`` refuse the data — ldp-label's labels
and probabilities, ldp-score's scores (``--simulate``), FedCP²-QQ's scores: every subject
paid for no release. Now each calibrator's ``check_inputs`` (the validators its
``calibrate`` uses) runs in ``check_data``, before anything is charged, for every
registered method and wrapper. Found on the way, refused before the charge too:

- a Mondrian group column without ``group_count`` (Mondrian's calibrate refused it after
  the charge);
- a group column given to a method that is not Mondrian: its sizes became a federated
  method's ``group_sizes``, and the release recorded the plan for those groups, not for the
  agents it ran on (a guarantee for m = 2 agents of 200 over a run on 4 agents of 100);
- a FedCP²-QQ grid the agents' mechanism refuses (a width that overflows a float, a step
  below the floats' resolution), refused by calibrate after every agent paid;
- a single value or a ragged list for an array (IndexError), a list (AttributeError), a
  one-column probability matrix (a multi-line pydantic error).

Every refusal is checked to leave every ledger table and the audit head as they were.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from privcal.calibrators import registry
from privcal.calibrators.base import CalibrationInput
from privcal.errors import InvalidInput
from tests.seeded import Seeded

N = 200
#: every table a run may write: a refused run must leave each exactly as it was
TABLES = ("datasets", "charges", "charge_members", "subject_spend", "subject_baseline",
          "releases", "release_charges", "release_keys", "audit_log", "audit_head",
          "audit_queue")

_rng = np.random.default_rng(7)
SCORES = _rng.uniform(size=N)
PROBS = _rng.dirichlet([1, 1, 1], size=N)
LABELS = _rng.integers(0, 3, size=N)
SUBJECTS = np.array([f"u{i}" for i in range(N)])
AGENTS = np.repeat([f"a{j}" for j in range(4)], N // 4)
GROUPS = np.arange(N) % 2

MONDRIAN = {"groups": ("g0", "g1"), "group_by": "column", "public_groups": True}
CENTRAL = {"split": {"alpha": 0.1}, "pcoqs": {"alpha": 0.1, "rho": 1},
           "exponq": {"alpha": 0.1, "epsilon": 1}}
#: every registered calibrator and wrapper: its parameters and well-formed data
METHODS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    **{m: (p, {"scores": SCORES}) for m, p in CENTRAL.items()},
    **{f"levels:{m}": ({**p, "alpha": [0.1, 0.2]}, {"scores": SCORES})
       for m, p in CENTRAL.items()},
    **{f"mondrian:{m}": ({**p, **MONDRIAN}, {"scores": SCORES, "groups": GROUPS,
                                            "group_count": 2})
       for m, p in CENTRAL.items()},
    "mondrian:levels:pcoqs": ({"alpha": [0.1, 0.2], "rho": 1, **MONDRIAN},
                              {"scores": SCORES, "groups": GROUPS, "group_count": 2}),
    "ldp-label": ({"alpha": 0.1, "epsilon": 2},
                  {"probs": PROBS, "labels": LABELS, "subjects": SUBJECTS}),
    "ldp-score": ({"alpha": 0.1, "epsilon": 1, "rounds": 4},
                  {"scores": SCORES, "subjects": SUBJECTS}),
    "fedcp-qq": ({"alpha": 0.1}, {"scores": SCORES, "agents": AGENTS}),
    "fedcp2-qq": ({"alpha": 0.1, "epsilon": 10}, {"scores": SCORES, "agents": AGENTS}),
}


def _at(a: np.ndarray, i: int, v: Any) -> np.ndarray:
    out = np.array(a, dtype=np.result_type(a, type(v)) if not isinstance(v, str) else object)
    out[i] = v
    return out


def _row_sum_2(p: np.ndarray) -> np.ndarray:
    out = p.copy()
    out[3] *= 2
    return out


#: (what is malformed, a change of the well-formed data, the one-line error)
Mutation = tuple[Callable[[dict[str, Any]], dict[str, Any]], str]
SCORE_KINDS: dict[str, Mutation] = {
    "NaN score": (lambda d: {**d, "scores": _at(d["scores"], 5, np.nan)}, "NaN"),
    "2-D scores": (lambda d: {**d, "scores": d["scores"].reshape(-1, 1)}, "1-D"),
    "scores as text": (lambda d: {**d, "scores": d["scores"].astype(str)}, "numeric"),
    "bool scores": (lambda d: {**d, "scores": d["scores"] > 0.5}, "numeric"),
    "one value, no rows": (lambda d: {**d, "scores": np.float64(0.5)}, "single value"),
    "ragged list": (lambda d: {**d, "scores": [[0.1, 0.2], [0.3]] * (N // 2)},
                    "not an array"),
}
FINITE_KINDS: dict[str, Mutation] = {
    "+inf score": (lambda d: {**d, "scores": _at(d["scores"], 5, np.inf)}, r"row 5 is inf"),
    "-inf score": (lambda d: {**d, "scores": _at(d["scores"], 5, -np.inf)}, r"row 5 is -inf"),
}
CENTRAL_KINDS: dict[str, Mutation] = {
    "one score": (lambda d: {**d, "scores": d["scores"][:1],
                             **({"groups": d["groups"][:1]} if "groups" in d else {})},
                  "at least 2 rows"),
}
GROUP_KINDS: dict[str, Mutation] = {
    "group outside the groups": (lambda d: {**d, "groups": _at(d["groups"], 3, 2)},
                                 r"lie in \[0, 2\)"),
    "float groups": (lambda d: {**d, "groups": d["groups"].astype(float)}, "integer group"),
    "no group_count": (lambda d: {**d, "group_count": None}, "group_count"),
    "groups of another length": (lambda d: {**d, "groups": d["groups"][:-1]}, "rows"),
}
SUBJECT_KINDS: dict[str, Mutation] = {
    "no subject ids": (lambda d: {**d, "subjects": None}, "subject id"),
    "float subject ids": (lambda d: {**d, "subjects": np.arange(N) + 0.0}, "not floats"),
    "subjects of another length": (lambda d: {**d, "subjects": d["subjects"][:-1]},
                                   "differ in length"),
}
LABEL_KINDS: dict[str, Mutation] = {
    "probabilities summing to 2": (lambda d: {**d, "probs": _row_sum_2(d["probs"])},
                                   "row 3 sums to 2"),
    "negative probability": (lambda d: {**d, "probs": np.where(
        np.arange(N)[:, None] == 3, [[-0.5, 1.0, 0.5]], d["probs"])}, "negative"),
    "infinite probability": (lambda d: {**d, "probs": np.where(
        np.arange(N)[:, None] == 3, [[np.inf, 0.0, 0.0]], d["probs"])}, "inf"),
    "NaN probability": (lambda d: {**d, "probs": np.where(
        np.arange(N)[:, None] == 3, [[np.nan, 0.5, 0.5]], d["probs"])}, "NaN"),
    "1-D probabilities": (lambda d: {**d, "probs": d["probs"][:, 0]}, "2-D"),
    "one class column": (lambda d: {**d, "probs": np.ones((N, 1))}, "at least 2 classes"),
    "probabilities as text": (lambda d: {**d, "probs": d["probs"].astype(str)}, "numeric"),
    "label outside the classes": (lambda d: {**d, "labels": _at(d["labels"], 7, 5)},
                                  r"row 7 is 5, outside \[0, 3\)"),
    "negative label": (lambda d: {**d, "labels": _at(d["labels"], 7, -1)}, "outside"),
    "label 2.5": (lambda d: {**d, "labels": _at(d["labels"], 7, 2.5)}, "not an integer"),
    "NaN label": (lambda d: {**d, "labels": _at(d["labels"], 7, np.nan)}, "NaN"),
    "labels as text": (lambda d: {**d, "labels": d["labels"].astype(str).astype(object)},
                       "numeric"),
    "2-D labels": (lambda d: {**d, "labels": d["labels"].reshape(-1, 1)}, "1-D"),
    "labels of another length": (lambda d: {**d, "labels": d["labels"][:-1]},
                                 "differ in length"),
}
AGENT_KINDS: dict[str, Mutation] = {
    "2-D agent ids": (lambda d: {**d, "agents": d["agents"].reshape(-1, 1)}, "1-D"),
    "float agent ids": (lambda d: {**d, "agents": np.arange(N) // 50 + 0.0}, "not floats"),
    "an empty agent id": (lambda d: {**d, "agents": _at(d["agents"], 0, "")}, "empty id"),
    "subjects other than the agents": (lambda d: {**d, "subjects": SUBJECTS},
                                       "its subjects are its agents"),
    "a Mondrian group column": (lambda d: {**d, "groups": GROUPS, "group_count": 2},
                                "Mondrian group column"),
}
KINDS: dict[str, dict[str, Mutation]] = {
    **{m: {**SCORE_KINDS, **FINITE_KINDS, **CENTRAL_KINDS,
           **(GROUP_KINDS if m.startswith("mondrian:") else {})}
       for m in METHODS if m.split(":")[-1] in CENTRAL},
    "ldp-label": {**LABEL_KINDS, **SUBJECT_KINDS},
    "ldp-score": {**SCORE_KINDS, **SUBJECT_KINDS},  # ±inf answer a query: allowed
    "fedcp-qq": {**SCORE_KINDS, **FINITE_KINDS, **AGENT_KINDS},
    "fedcp2-qq": {**SCORE_KINDS, **FINITE_KINDS, **AGENT_KINDS,
                  "agents of unequal sizes": (lambda d: {**d, "agents": np.array(
                      ["a0"] * 51 + ["a1"] * 49 + ["a2"] * 50 + ["a3"] * 50)},
                      "same number of scores")},
}


def _ledger(acct: Any) -> tuple[Any, dict[str, list[str]]]:
    """The audit head and every row of every table a run writes."""
    with acct.ledger.engine.connect() as c:
        rows = {t: sorted(repr(tuple(r)) for r in c.execute(text(f"SELECT * FROM {t}")))
                for t in TABLES}
    return acct.ledger.head(), rows


def _dataset(acct: Any, method: str) -> None:
    budget = {"rho": 100} if method.endswith("pcoqs") else {"epsilon": 100}
    acct.create_dataset("d", **budget, subject_epsilon=50, allow_nonprivate=True)


@pytest.mark.parametrize("method", list(METHODS))
def test_malformed_input_through_run_is_refused_before_anything_is_charged(
        accountant: Any, method: str) -> None:
    """For each method, each kind of malformed input it takes (``KINDS``): a one-line
    InvalidInput naming the problem, and the ledger as it was. Then the control: the same
    parameters and data, well-formed, are charged and released."""
    acct = accountant
    _dataset(acct, method)
    params, good = METHODS[method]
    cal = registry.get(method).calibrator
    problems = []
    for kind, (change, msg) in KINDS[method].items():
        before = _ledger(acct)
        try:
            acct.run(cal, params, CalibrationInput(**change(good)), dataset="d",
                     rng=Seeded(0))
        except InvalidInput as exc:
            if re.search(msg, str(exc)) is None or "\n" in str(exc):
                problems.append(f"{kind}: message {str(exc)!r}")
        except Exception as exc:  # every other outcome is reported
            problems.append(f"{kind}: {type(exc).__name__}: {exc}")
        else:
            problems.append(f"{kind}: released")
        if _ledger(acct) != before:
            problems.append(f"{kind}: the ledger changed")
    assert problems == []
    rel = acct.run(cal, params, CalibrationInput(**good), dataset="d", rng=Seeded(0))
    assert [r.id for r in acct.releases("d")] == [rel.id]
    nonprivate = method == "fedcp-qq" or method.split(":")[-1] == "split"
    # two pure ε-DP levels are two charges, in one transaction (red team 25, privacy2 F1)
    charges = 2 if method == "levels:exponq" else 1
    assert acct.budget("d").charges == (0 if nonprivate else charges)
    assert len(rel.charge_ids) == (0 if nonprivate else charges)


@pytest.mark.parametrize("method", ["ldp-label", "ldp-score", "fedcp2-qq"])
def test_a_refused_run_leaves_every_subject_its_budget(accountant: Any, method: str) -> None:
    """The reviewer's repro: after a refusal, each subject (agent) is charged ε0 exactly
    once by the well-formed run: the refused one spent nothing of anyone's cap."""
    acct = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=20)
    params, good = METHODS[method]
    bad = KINDS[method]["label outside the classes" if method == "ldp-label"
                        else "2-D scores"][0](good)
    cal = registry.get(method).calibrator
    with pytest.raises(InvalidInput):
        acct.run(cal, params, CalibrationInput(**bad), dataset="d")
    acct.run(cal, params, CalibrationInput(**good), dataset="d", rng=Seeded(0))
    with acct.ledger.engine.connect() as c:
        charges = c.execute(text("SELECT scope, subjects_accepted FROM charges")).all()
    assert [(s, int(k)) for s, k in charges] == [("subjects", 4 if method == "fedcp2-qq"
                                                   else N)]


@pytest.mark.parametrize("extra,msg", [({"lower": -1e308, "upper": 1e308}, "too wide"),
                                       ({"lower": 1.0, "upper": 1.0 + 1e-15, "bins": 1000},
                                        "strictly increasing")])
@pytest.mark.parametrize("entry", ["run", "calibrate"])
def test_a_fedcp2_grid_the_mechanism_refuses_is_refused_before_the_agents_pay(
        accountant: Any, extra: dict[str, Any], msg: str, entry: str) -> None:
    acct = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=20)
    before = _ledger(acct)
    params = {"alpha": 0.1, "epsilon": 10, **extra}
    with pytest.raises(InvalidInput, match=msg):
        if entry == "run":
            acct.run(registry.get("fedcp2-qq").calibrator, params,
                     CalibrationInput(scores=SCORES, agents=AGENTS), dataset="d")
        else:
            acct.calibrate("fedcp2-qq", params, dataset="d", scores=SCORES, agents=AGENTS)
    assert _ledger(acct) == before


@pytest.mark.parametrize("method", ["fedcp-qq", "fedcp2-qq"])
def test_a_group_column_never_replaces_the_agents_sizes(accountant: Any, method: str) -> None:
    """Before: the Mondrian column's sizes (2 × 200) became the shape's group sizes, and the
    release recorded the plan of 2 agents while the run planned for its 4 agents of 50."""
    acct = accountant
    _dataset(acct, method)
    params, good = METHODS[method]
    with pytest.raises(InvalidInput, match="Mondrian group column"):
        acct.run(registry.get(method).calibrator, params,
                 CalibrationInput(**good, groups=GROUPS, group_count=2), dataset="d")
    rel = acct.run(registry.get(method).calibrator, params, CalibrationInput(**good),
                   dataset="d", rng=Seeded(0))
    assert rel.shape["group_sizes"] == [50] * 4 and rel.coverage.details["m"] == 4


@pytest.mark.parametrize("method", ["split", "pcoqs", "ldp-score"])
def test_a_list_is_read_as_its_array(accountant: Any, method: str) -> None:
    """A Python list (``CalibrationInput.n`` raised AttributeError on it) runs as the same
    array does: the same release from the same seed."""
    acct = accountant
    _dataset(acct, method)
    params, good = METHODS[method]
    cal = registry.get(method).calibrator
    as_list = acct.run(cal, params, CalibrationInput(**{**good, "scores": list(SCORES)}),
                       dataset="d", rng=Seeded(3))
    as_array = acct.run(cal, params, CalibrationInput(**good), dataset="d",
                        rng=Seeded(3))
    assert (as_list.threshold, as_list.shape) == (as_array.threshold, as_array.shape)


@pytest.mark.parametrize(("method", "inputs", "msg"), [
    ("ldp-label", {"probs": PROBS, "labels": _at(LABELS, 7, 5), "subjects": SUBJECTS},
     "outside"),
    ("ldp-label", {"probs": _row_sum_2(PROBS), "labels": LABELS, "subjects": SUBJECTS},
     "sums to 2"),
    ("fedcp2-qq", {"scores": _at(SCORES, 17, np.inf), "agents": AGENTS}, "inf"),
    ("ldp-score", {"scores": SCORES.reshape(-1, 1), "subjects": SUBJECTS}, "1-D"),
])
def test_calibrate_refuses_the_same_inputs_before_the_charge(
        accountant: Any, method: str, inputs: dict[str, Any], msg: str) -> None:
    """``Accountant.calibrate`` (the CLI's and the service's path) refuses them too, with
    nothing written (it did before; kept as it is)."""
    acct = accountant
    _dataset(acct, method)
    params = METHODS[method][0]
    before = _ledger(acct)
    with pytest.raises(InvalidInput, match=msg) as exc:
        acct.calibrate(method, params, dataset="d", **inputs)
    assert "\n" not in str(exc.value)
    assert _ledger(acct) == before
