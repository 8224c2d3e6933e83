"""Red team 7, the printed words of a dataset's guarantee and realized spend.

F-1: the short forms of a dataset's guarantee (``GuaranteeReport.short``, the budget summary,
human ``budget show``, the web page) said "(1, 0)-DP however requests adapt" for a dataset
that allows non-private releases and had published one, and never named the neighbouring
relation: what the full statement qualifies, every short form now says.

F-2: the realized spend (``budget show``, ``audit report``'s timeline) left out local-DP
reports: five ε0 = 1 reports from the same subjects printed "ε=0 (nothing spent)". It now
adds the largest per-subject Σε0 (basic composition, as the guarantee adds the subject cap).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import numpy as np
from click.testing import CliRunner

from privcal import Accountant
from privcal.accountant import GuaranteeReport
from privcal.accountant.report import audit_report
from privcal.cli import main
from privcal.costs import PureDP

NONPRIV = "its non-private releases (its policy allows them) have no privacy guarantee"
NEIGHBOURS = "for neighbours in the sense each release states"


def _cli(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--db-url", url, *args], catch_exceptions=False)


def _nonprivate_dataset(acct: Accountant) -> None:
    """Dataset ``np`` (ε ≤ 1, non-private releases allowed) with a published split threshold."""
    acct.create_dataset("np", epsilon=1, allow_nonprivate=True)
    scores = np.random.default_rng(0).random(500)
    rel = acct.calibrate("split", {"alpha": 0.1}, dataset="np", scores=scores)
    assert rel.privacy is not None and "non-private" in rel.privacy["statement"]


def _local_dataset(acct: Accountant) -> None:
    """Dataset ``loc`` (ε ≤ 1, subject ε ≤ 5): five ε0 = 1 reports from each of three
    subjects, then one from a fourth alone."""
    acct.create_dataset("loc", epsilon=1, subject_epsilon=5)
    for _ in range(5):
        acct.charge_subjects("loc", 1, ["alice", "bob", "carol"])
    acct.charge_subjects("loc", 1, ["dave"])


# ------------------------------------------------------------------------ F-1: the words
def test_nonprivate_dataset_short_forms_leave_its_nonprivate_releases_out(
    accountant: Accountant,
) -> None:
    _nonprivate_dataset(accountant)
    b = accountant.budget("np")
    assert NONPRIV in b.guarantee.statement  # the full statement always said it
    short = b.guarantee.short
    assert short.startswith("(1, 0)-DP for its private releases, however requests adapt")
    assert NONPRIV in short and NEIGHBOURS in short
    assert NONPRIV in b.summary and NEIGHBOURS in b.summary
    assert "guarantee (1, 0)-DP for its private releases" in b.summary


def test_private_dataset_short_form_names_adaptivity_and_neighbours(
    accountant: Accountant,
) -> None:
    accountant.create_dataset("p", epsilon=1)
    accountant.charge("p", PureDP(eps="0.25"))
    g = accountant.budget("p").guarantee
    assert g.short.startswith("(1, 0)-DP however requests adapt, " + NEIGHBOURS)
    assert "non-private" not in g.short and "private releases" not in g.short
    # a report that does not know whether non-private releases are allowed says it all
    bare = GuaranteeReport(epsilon=g.epsilon, delta=g.delta, rule=g.rule,
                           statement=g.statement)
    assert bare.short == g.statement


def test_cli_budget_show_words_on_a_nonprivate_dataset(accountant: Accountant,
                                                       ledger_url: str) -> None:
    _nonprivate_dataset(accountant)
    res = _cli(ledger_url, "budget", "show", "np")
    assert res.exit_code == 0, res.output
    (row,) = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("guarantee ")]
    assert "(1, 0)-DP for its private releases, however requests adapt" in row
    assert NONPRIV in row and NEIGHBOURS in row
    doc = json.loads(_cli(ledger_url, "budget", "show", "np", "--json").stdout)
    assert NONPRIV in doc["guarantee"]["statement"]


def _ui_page(acct: Accountant) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """The /ui page as an auditor sees it, ``loc``'s budget and spend history (HTTP)."""
    import httpx

    from privcal.service.app import create_app
    from privcal.service.bound_tokens import create_bound_token
    from tests.service.conftest import start_server

    tok = str(create_bound_token(acct, "auditor", name="aud", datasets=[], session=None,
                                 subject=None, agent=None, expires_in=None).token)
    url, server, th = start_server(create_app(accountant=acct))  # a real server
    try:
        with httpx.Client(base_url=url, timeout=60) as c:
            r = c.post("/ui/login", data={"token": tok}, follow_redirects=False)
            assert r.status_code == 303, r.text
            page = c.get("/ui/")
            assert page.status_code == 200, page.text
            hdr = {"Authorization": f"Bearer {tok}"}
            budget = c.get("/v1/datasets/loc/budget", headers=hdr)
            assert budget.status_code == 200, budget.text
            hist = c.get("/v1/datasets/loc/spend-history", headers=hdr)
            assert hist.status_code == 200, hist.text
    finally:
        server.should_exit = True
        th.join(timeout=30)
    return page.text, budget.json(), hist.json()["points"]


def test_ui_and_service_print_the_qualified_guarantee_and_local_spend(
    accountant: Accountant,
) -> None:
    _nonprivate_dataset(accountant)
    _local_dataset(accountant)
    html, budget, points = _ui_page(accountant)
    # F-1: the web page's line for np, as the template prints it
    (line,) = [ln for ln in html.splitlines() if "0 charges · 1 releases" in ln]
    assert "guarantee: (1, 0)-DP for its private releases, however requests adapt" in line
    assert NONPRIV in line and NEIGHBOURS in line
    assert f"{NONPRIV} · spent so far" in line  # the short form whole: nothing tacked on
    assert "(1, 0)-DP however requests adapt" not in html
    # F-2: the service's budget document and spend history count the local-DP reports
    assert budget["spent_dp"]["epsilon"] == "5" and budget["spent_dp"]["subject_max"] == "5"
    assert points[-1]["spent_dp_after"].startswith("spent so far ε=5, δ=0 ")
    (loc,) = [ln for ln in html.splitlines() if "6 charges · 0 releases" in ln]
    assert "spent so far as (ε, δ): ε=5, δ=0" in loc


# ------------------------------------------------------------- F-2: the realized spend
def test_realized_spend_includes_the_largest_subject_spend(accountant: Accountant) -> None:
    _local_dataset(accountant)
    assert accountant.subject_spend("loc", "alice") == 5
    dp = accountant.budget("loc").spent_dp
    # the worst subject has spent 5 (dave's 1 is not added to it: the largest, not a sum)
    assert (dp.epsilon, dp.delta) == (Decimal(5), Decimal(0))
    assert (dp.central_epsilon, dp.subject_max) == (Decimal(0), Decimal(5))
    assert "local-DP reports: largest per-subject Σε0 = 5" in dp.rule
    accountant.charge("loc", PureDP(eps="0.5"))
    dp = accountant.budget("loc").spent_dp
    assert (dp.epsilon, dp.central_epsilon, dp.subject_max) == (
        Decimal("5.5"), Decimal("0.5"), Decimal(5))
    assert "ε=5.5" in accountant.budget("loc").summary
    # a dataset without a subject cap takes no local-DP reports: its figure is unchanged
    accountant.create_dataset("c", epsilon=1)
    accountant.charge("c", PureDP(eps="0.5"))
    dp = accountant.budget("c").spent_dp
    assert (dp.epsilon, dp.subject_max, dp.rule) == (Decimal("0.5"), None,
                                                      "basic composition (Σε)")


def test_audit_timeline_includes_local_reports(accountant: Accountant) -> None:
    _local_dataset(accountant)
    accountant.charge("loc", PureDP(eps="0.5"))
    (rep,) = audit_report(accountant, "loc")
    after = [t.spent_dp_after for t in rep.timeline]
    # after k batches to the same subjects each has spent k: replayed as at most k
    for k in range(1, 6):
        assert after[k - 1].startswith(f"spent so far ε={k}, δ=0 "), after[k - 1]
        assert f"largest per-subject Σε0 ≤ {k}," in after[k - 1]
    assert after[5].startswith("spent so far ε=5, δ=0 ")  # dave's batch: still 5 at most
    # the last entry is exact, as budget show prints it
    assert after[6].startswith("spent so far ε=5.5, δ=0 ")
    assert "largest per-subject Σε0 = 5," in after[6]


def test_audit_timeline_never_reports_more_than_the_largest_spend(
    accountant: Accountant,
) -> None:
    """Batches to different subjects: the replay's bound is today's largest spend (1), not
    the batches' running sum (2)."""
    accountant.create_dataset("d", epsilon=1, subject_epsilon=5)
    accountant.charge_subjects("d", 1, ["x"])
    accountant.charge_subjects("d", 1, ["y"])
    (rep,) = audit_report(accountant, "d")
    assert [t.spent_dp_after.split(" [")[0] for t in rep.timeline] == [
        "spent so far ε=1, δ=0", "spent so far ε=1, δ=0"]
    assert accountant.budget("d").spent_dp.epsilon == 1


def test_cli_budget_show_and_audit_report_count_local_reports(accountant: Accountant,
                                                              ledger_url: str) -> None:
    _local_dataset(accountant)
    doc = json.loads(_cli(ledger_url, "budget", "show", "loc", "--json").stdout)
    assert doc["spent_dp"]["epsilon"] == "5" and doc["spent_dp"]["delta"] == "0"
    assert doc["spent_dp"]["subject_max"] == "5" and doc["spent_dp"]["central_epsilon"] == "0"
    human = _cli(ledger_url, "budget", "show", "loc").stdout
    (row,) = [ln for ln in human.splitlines() if "spent so far as (ε, δ)" in ln]
    assert "ε=5, δ=0" in row and "largest per-subject Σε0 = 5" in row
    assert "nothing spent);" not in row
    rep = json.loads(_cli(ledger_url, "audit", "report", "--dataset", "loc", "--json").stdout)
    last = rep[0]["timeline"][-1]["spent_dp_after"]
    assert last.startswith("spent so far ε=5, δ=0 ") and "Σε0 = 5" in last
    human = _cli(ledger_url, "audit", "report", "--dataset", "loc").stdout
    assert "spent so far ε=5, δ=0 " in human and "spent so far ε=0," not in human
