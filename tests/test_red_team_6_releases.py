"""Red team 6, releases: the audit report of several-level releases, the recorded guarantee
of a several-level Mondrian release (and its 1.0.0 releases still verifying), saved release
files checked for internal consistency on load, and a device list with a byte-order mark."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from privcal import Release
from privcal.accountant.releases import record_release
from privcal.calibrators.prediction_sets import set_labels
from privcal.cli import main
from privcal.costs import ZCDP
from privcal.errors import InvalidInput
from tests.seeded import Seeded


def _data(n: int = 1500, k: int = 3, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(k) * 2, n)
    y = np.array([rng.choice(k, p=p) for p in probs])
    return probs, y


# ---------------------------------------------------------------- 1. audit report
def test_audit_report_cli_and_service_list_a_several_level_release(accountant: Any,
                                                                    ledger_url: str) -> None:
    """A release at several levels (alpha a list) used to crash the report (pydantic error),
    hence ``privcal audit report``, the spend-history endpoint and the UI home page."""
    from privcal.accountant.report import audit_report
    from privcal.service.app import create_app
    from privcal.service.bound_tokens import create_bound_token
    from tests.service.conftest import start_server

    accountant.create_dataset("a", rho=1)
    probs, y = _data(600)
    accountant.calibrate("pcoqs", dataset="a", alpha=[0.1, 0.2], rho=0.1, probs=probs,
                         labels=y, score="lac", rng=Seeded(1))
    rep = audit_report(accountant, "a")[0]
    assert rep.releases[0].alpha == [0.1, 0.2]
    human = CliRunner().invoke(main, ["--db-url", ledger_url, "audit", "report"])
    assert human.exit_code == 0, human.output
    assert "0.1, 0.2" in human.stdout and "2 levels; at α=0.1" in human.stdout
    as_json = CliRunner().invoke(main, ["--db-url", ledger_url, "audit", "report", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)[0]["releases"][0]["alpha"] == [0.1, 0.2]
    tok = create_bound_token(accountant, "auditor", name="aud", datasets=[], session=None,
                             subject=None, agent=None, expires_in=None)
    url, server, th = start_server(create_app(accountant=accountant))  # a real server
    try:
        r = httpx.get(f"{url}/v1/datasets/a/spend-history", timeout=60,
                      headers={"Authorization": f"Bearer {tok.token}"})
        assert r.status_code == 200, r.text
        assert len(r.json()["points"]) == 1
    finally:
        server.should_exit = True
        th.join(timeout=30)


# ---------------------------------------------------------------- 2. Mondrian at levels
def test_mondrian_several_levels_states_every_level_and_old_releases_verify(
        accountant: Any) -> None:
    """The statement of a Mondrian release at α = 0.1, 0.2 states both levels (it stated the
    smallest α's only, without saying so); the headline numbers are the smallest α's, as
    for ``levels:``; a release wrapper 1.0.0 recorded, in its wording, still verifies."""
    accountant.create_dataset("m", rho=10)
    probs, y = _data()
    rel = accountant.calibrate("pcoqs", dataset="m", alpha=[0.1, 0.2], rho=0.5, probs=probs,
                               labels=y, score="lac", mondrian="label", public_groups=True,
                               rng=Seeded(2))
    cov = rel.coverage
    rows = rel.thresholds()
    low = {a: min(r["lower"] for r in rows if r["alpha"] == a) for a in (0.1, 0.2)}
    assert low == {0.1: 0.9, 0.2: 0.8}
    assert cov.lower == low[0.1]  # the headline: the smallest α's, as levels: records it
    fails = {a: sum(cov.details[f"group {g}: alpha={a:g}: failure_probability"]
                    for g in ("0", "1", "2")) for a in (0.1, 0.2)}
    assert cov.failure_probability == pytest.approx(fails[0.1])
    assert cov.statement.startswith("2 levels; at α=0.1: for each of the 3 label groups g")
    first, second = cov.statement.removeprefix("2 levels; at α=0.1: ").split("; at α=0.2: ")
    assert f"(smallest: {low[0.2]:.6g}, group '0')" in second
    assert f"all groups at once with probability ≥ {1 - fails[0.2]:.6g}" in second
    assert second.endswith(f"hence marginal coverage ≥ {low[0.2]:.6g}")
    assert first.endswith(f"hence marginal coverage ≥ {low[0.1]:.6g}")
    own, inner = rel.calibrator_version.split("/", 1)
    assert own == "1.1.0"
    # a release as Mondrian 1.0.0 recorded it: its statement the smallest α's sentence alone
    paid = accountant.charge("m", ZCDP(rho=1))
    old_cov = cov.model_copy(update={"statement": first})
    record_release(accountant.ledger, "m", _as_computed=True, method=rel.method,
                   calibrator_version=f"1.0.0/{inner}", threshold=rel.threshold,
                   params=rel.params, shape=rel.shape, coverage=old_cov, privacy=rel.privacy,
                   diagnostics=rel.diagnostics, distribution=rel.distribution,
                   distribution_version=rel.distribution_version, charge_ids=[paid.charge_id])
    rep = accountant.verify()
    assert rep.guarantees_recomputed == 2
    assert rep.statements_not_compared == 0  # 1.0.0's sentence is recomputed in its wording
    # the installed version never records the old sentence
    paid = accountant.charge("m", ZCDP(rho=1))
    with pytest.raises(InvalidInput, match="statement"):
        accountant.record_release(
            "m", method=rel.method, calibrator_version=rel.calibrator_version,
            threshold=rel.threshold, params=rel.params, shape=rel.shape, coverage=old_cov,
            privacy=rel.privacy, diagnostics=rel.diagnostics, distribution=rel.distribution,
            distribution_version=rel.distribution_version, charge_ids=[paid.charge_id])


# ---------------------------------------------------------------- 3. saved releases
def _doc(rel: Any) -> dict[str, Any]:
    return json.loads(rel.model_dump_json())


def _load(doc: dict[str, Any]) -> Release:
    return Release.load(json.dumps(doc))


def test_release_load_refuses_an_inconsistent_file(accountant: Any, tmp_path: Path) -> None:
    """An edited file is refused on load (one line) when it is not internally consistent;
    the files privcal writes load as they were; a consistently edited one (class names
    reordered) still loads: a saved file is not compared with the ledger."""
    accountant.create_dataset("d", rho=10, allow_nonprivate=True)
    gen = np.random.default_rng(0)
    probs = gen.dirichlet([1, 1, 1], size=500)
    y = gen.choice(["a", "b", "c"], size=500)
    plain = accountant.calibrate("split", dataset="d", alpha=0.2, probs=probs, labels=y,
                                 classes=["a", "b", "c"], score="lac")
    levels = accountant.calibrate("pcoqs", dataset="d", alpha=[0.1, 0.2], rho=0.5,
                                  probs=probs, labels=y, classes=["a", "b", "c"], score="lac",
                                  rng=Seeded(1))
    mond = accountant.calibrate("pcoqs", dataset="d", alpha=[0.1, 0.2], rho=0.5, probs=probs,
                                labels=y, classes=["a", "b", "c"], score="lac",
                                mondrian="label", public_groups=True, rng=Seeded(2))
    for rel in (plain, levels, mond):
        path = tmp_path / f"r{rel.id}.json"
        path.write_text(rel.model_dump_json())
        saved = Release.load(path)
        assert saved == rel == accountant.release(saved.id)  # how to check a copy

    def refused(doc: dict[str, Any], match: str) -> None:
        with pytest.raises(InvalidInput, match=match) as exc:
            _load(doc)
        assert "\n" not in str(exc.value)

    # the red team's edit: α and the coverage raised (its recomputed guarantee differs)
    doc = _doc(plain)
    doc["params"]["alpha"] = 0.01
    doc["coverage"].update(target=0.99, lower=0.99, statement="P(Y in C(X)) >= 0.99")
    refused(doc, "not a consistent saved release: coverage")
    doc = _doc(plain)
    doc["coverage"]["lower"] = 0.99
    refused(doc, "coverage.lower")
    doc = _doc(plain)
    doc["coverage"]["statement"] = "P(Y in C(X)) >= 0.99"
    refused(doc, "coverage.statement")
    doc = _doc(plain)
    doc["params"]["alpha"] = 2
    refused(doc, "cannot be recomputed")
    # class names: two for k = 3 (predict_labels raised IndexError), or one twice
    for names, match in ((["a", "b"], "names 2 classes.*k = 3"),
                         (["a", "a", "b"], "a class twice"), ([1, 2, 3], "class names")):
        doc = _doc(plain)
        doc["diagnostics"]["classes"] = names
        refused(doc, match)
    doc = _doc(plain)
    doc["threshold"] = float("nan")
    refused(doc, "threshold is NaN")
    # levels: the levels recorded are not params.alpha, a nested threshold edited
    doc = _doc(levels)
    doc["diagnostics"]["levels"][1]["alpha"] = 0.3
    refused(doc, "one entry per level")
    doc = _doc(levels)
    doc["diagnostics"]["levels"][1]["threshold"] = 0.0
    refused(doc, "nested maxima")
    doc = _doc(levels)
    doc["diagnostics"]["levels"][0]["threshold_raw"] = float("nan")
    refused(doc, "threshold_raw is NaN")
    # Mondrian: a group's n edited, the groups' entries not the record's
    doc = _doc(mond)
    doc["diagnostics"]["groups"][0]["n"] += 1
    refused(doc, "group a: n")  # label groups named by their classes (red team 19, F6)
    doc = _doc(mond)
    doc["diagnostics"]["groups"] = [1, 2, 3]
    refused(doc, "diagnostics")
    # not detectable without the ledger (documented): the class names reordered
    doc = _doc(plain)
    doc["diagnostics"]["classes"] = ["c", "b", "a"]
    assert _load(doc).classes == ["c", "b", "a"] and _load(doc) != plain


def test_set_labels_refuses_class_names_of_the_wrong_length() -> None:
    sets = np.array([[True, False, True]])
    assert set_labels(sets, ["a", "b", "c"]) == [["a", "c"]]
    with pytest.raises(InvalidInput, match="2 class names for sets over 3 classes"):
        set_labels(sets, ["a", "b"])


# ---------------------------------------------------------------- 4. device list with a BOM
def test_token_subjects_file_with_a_byte_order_mark(accountant: Any, ledger_url: str,
                                                    tmp_path: Path) -> None:
    """A device list saved by Windows Notepad starts with U+FEFF: read as the CSV reader
    reads files (utf-8-sig), its first id is 'alice', not refused as an invisible character."""
    from privcal.accountant.sessions import open_session

    accountant.create_dataset("s", rho="1", subject_epsilon="10")
    sid = open_session(accountant, "ldp-score", dataset="s", alpha=0.2, epsilon=1.0, rounds=1,
                       group_size=2, requester="t").id
    f = tmp_path / "devices.txt"
    f.write_bytes(b"\xef\xbb\xbfalice\r\nbob\r\n")
    r = CliRunner().invoke(main, ["--db-url", ledger_url, "token", "create", "--role",
                                  "device", "--session", str(sid), "--subjects", str(f),
                                  "--json"])
    assert r.exit_code == 0, r.output
    assert [x["subject"] for x in json.loads(r.stdout)] == ["alice", "bob"]
