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
import random
from typing import Any

import numpy as np
import pytest

from privcal import Release
from privcal.errors import InvalidInput
from tests.test_red_team_6_trust import _as_old, _releases


def _pcoqs(acct: Any) -> Any:
    acct.create_dataset("d", rho=1, delta=1e-6)
    return acct.calibrate("pcoqs", dataset="d", scores=np.random.default_rng(0).random(2000),
                          alpha=0.1, rho=0.1, rng=random.Random(0))


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
    central charge), federated (fedcp-qq non-private, fedcp2-qq), and releases of the
    calibrator versions before red team 6 in their wording: each loads as it is."""
    rels = _releases(accountant)
    rels["pcoqs"] = _pcoqs(accountant)
    old = {name: accountant.release(_as_old(accountant, rel, "ldp-score"
                                            if name == "shuffled" else name))
           for name, rel in rels.items() if name != "pcoqs"}
    for name, rel in [*rels.items(), *((f"old {n}", r) for n, r in old.items())]:
        assert Release.load(rel.model_dump_json()) == rel, name
    # the shuffled record's amplified ε is derived from its parameters too
    shuffled = json.loads(rels["shuffled"].model_dump_json())
    shuffled["privacy"]["extra"]["amplification"]["eps"] = 0.01
    with pytest.raises(InvalidInput, match=r"privacy\."):
        Release.load(json.dumps(shuffled))


@pytest.mark.parametrize("edit", [{"calibrator_version": "2.4.0"}, {"method": "exponq"}])
def test_an_unknown_version_of_an_installed_method_is_not_loaded_unchecked(
        accountant: Any, edit: dict[str, Any]) -> None:
    """A coverage of 0.99 in place of 0.9 was refused alone but loaded once the version
    label (or the method's name) was changed too: the check returned early for a version
    the installed code does not know. Now such a file is refused in one line; another
    package's method of that name is still loaded as its own (not checked here)."""
    rel = _pcoqs(accountant)
    doc = json.loads(rel.model_dump_json())
    doc["coverage"]["lower"] = 0.99
    doc["coverage"]["statement"] = "P(Y ∈ C(X)) ≥ 0.99"
    with pytest.raises(InvalidInput, match=r"not a consistent saved release: .*version .* is "
                                           r"not one this privcal knows") as e:
        Release.load(json.dumps({**doc, **edit}))
    assert "\n" not in str(e.value)
    other = Release.load(json.dumps({**doc, "distribution": "someone-else"}))
    assert other.coverage.lower == 0.99  # README: another package's guarantee is its own
