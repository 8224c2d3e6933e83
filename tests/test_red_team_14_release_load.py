"""Red team 14 (README walk-through): ``Release.load`` checked a saved release's coverage
guarantee against the installed code but not its privacy record — a copy whose ε was cut
from 2.14194 to 0.1, whose cost contradicted its own ρ, or whose model said "local" loaded.
Now the privacy record is recomputed from the recorded parameters and shape as ``audit
verify`` recomputes it, at the reporting δ the record states; every genuine release still
loads (central, local, shuffled, federated; an older calibrator version's wording too).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

from privcal import Release
from privcal.errors import InvalidInput
from tests.seeded import Seeded
from tests.test_red_team_6_trust import _as_old, _releases


def _pcoqs(acct: Any) -> Any:
    acct.create_dataset("d", rho=1, delta=1e-6)
    return acct.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(0).random(2000),
                          alpha=0.1, rho=0.1, rng=Seeded(0))


def _edit(rel: Any, **changes: Any) -> str:
    doc = json.loads(rel.model_dump_json())
    priv = copy.deepcopy(doc["privacy"])
    for key, value in changes.items():
        if key == "rho":
            priv["cost"]["rho"] = value
        else:
            priv[key] = value
    doc["privacy"] = priv
    return json.dumps(doc)


@pytest.mark.parametrize("changes", [
    {"epsilon": "0.1",  # ε cut 21×, the statement edited to match
     "statement": "0.1-zCDP (central), hence (0.1, 0.000001)-DP by CKS20"},
    {"rho": "0.001"},  # the cost contradicts params.rho = 0.1
    {"model": "local"},
    {"rule": "pure ε-DP"},
    {"neighbouring": "any two datasets"},
    {"delta": "0.001"},  # the reporting δ edited alone: ε no longer follows from it
])
def test_a_saved_release_whose_privacy_record_contradicts_its_parameters_is_refused(
        accountant: Any, changes: dict[str, Any]) -> None:
    rel = _pcoqs(accountant)
    assert rel.privacy["epsilon"] == "2.14194" and rel.params["rho"] == 0.1
    with pytest.raises(InvalidInput, match=r"not a consistent saved release: privacy\.") as e:
        Release.load(_edit(rel, **changes))
    assert "\n" not in str(e.value)
    assert Release.load(rel.model_dump_json()) == rel  # the genuine copy loads


def test_every_genuine_release_loads_with_its_privacy_record(accountant: Any) -> None:
    """Local (ldp-score, ldp-label), shuffled on an (ε, δ) cap (its amplification and
    central charge), federated (fedcp-qq non-private, fedcp2-qq) and central releases each
    load as they are. A file in the wording of the calibrator versions before red team 6
    (the honest-participants clause absent), which this privcal does not reproduce, is
    refused in one line: a file has no ledger vouching for its sentences (the ledger's own
    record of it still verifies, counted as not compared)."""
    rels = _releases(accountant)
    rels["pcoqs"] = _pcoqs(accountant)
    for name, rel in rels.items():
        assert Release.load(rel.model_dump_json()) == rel, name
    for name, rel in rels.items():
        if name == "pcoqs":
            continue
        old = accountant.release(_as_old(accountant, rel, "ldp-score"
                                         if name == "shuffled" else name))
        with pytest.raises(InvalidInput, match=r"not a consistent saved release: coverage\.over"
                           r": recorded [^\n]*$"):
            Release.load(old.model_dump_json())
    # the shuffled record's amplified ε is derived from its parameters too, and its central
    # charge cannot be dropped from a copy (a shuffled run exists only on an (ε, δ) cap)
    shuffled = json.loads(rels["shuffled"].model_dump_json())
    assert "central_cost" in shuffled["privacy"]
    for edit in ("eps", "central_cost"):
        doc = copy.deepcopy(shuffled)
        if edit == "eps":
            doc["privacy"]["extra"]["amplification"]["eps"] = 0.01
        else:
            del doc["privacy"]["central_cost"]
        with pytest.raises(InvalidInput, match=r"privacy\."):
            Release.load(json.dumps(doc))


def test_a_relabelled_copy_does_not_escape_the_check(accountant: Any) -> None:
    """Red team 14 (diffrev): the sentences of a copy relabelled as a calibrator version
    still known (the previous one), or stripped of its ``neighbouring`` (as if written before
    it existed), or naming another distribution for a built-in method, were not compared —
    any statement loaded. Now each is refused."""
    rel = _pcoqs(accountant)
    doc = json.loads(rel.model_dump_json())
    false = {"statement": "0.0001-DP (edited)"}
    cases = {
        "an older version's label": {**doc, "calibrator_version": "2.2.0",
                                     "coverage": {**doc["coverage"], "statement": "P ≥ 0.999"}},
        "no neighbouring": {**doc, "privacy": {k: v for k, v in {**doc["privacy"], **false}
                                               .items() if k != "neighbouring"}},
        "another distribution": {**doc, "distribution": "someone-else",
                                 "coverage": {**doc["coverage"], "lower": 0.999}},
    }
    for what, edited in cases.items():
        with pytest.raises(InvalidInput, match="not a consistent saved release") as e:
            Release.load(json.dumps(edited))
        assert "\n" not in str(e.value), what


@pytest.mark.parametrize("edit", [{"calibrator_version": "2.4.0"}, {"method": "exponq"}])
def test_an_unknown_version_of_an_installed_method_is_not_loaded_unchecked(
        accountant: Any, edit: dict[str, Any]) -> None:
    """A coverage of 0.99 in place of 0.9 was refused alone but loaded once the version
    label (or the method's name) was changed too: the check returned early for a version
    the installed code does not know. Now such a file is refused in one line (a plugin's
    method at a version its installed release does not declare still loads unchecked)."""
    rel = _pcoqs(accountant)
    doc = json.loads(rel.model_dump_json())
    doc["coverage"]["lower"] = 0.99
    doc["coverage"]["statement"] = "P(Y ∈ C(X)) ≥ 0.99"
    with pytest.raises(InvalidInput, match=r"not a consistent saved release: .*version .* is "
                                           r"not one this privcal knows") as e:
        Release.load(json.dumps({**doc, **edit}))
    assert "\n" not in str(e.value)
