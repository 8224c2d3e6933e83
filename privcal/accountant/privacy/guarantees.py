"""What a dataset's cap guarantees, and what its charges so far have spent: pure mathematics.

The dataset's *guarantee* is its filter's (:func:`filter_guarantee`).
The realized spend (:func:`spent_epsilon`) is what the charges so far would
guarantee had they been fixed in advance; for adaptively chosen charges it is an
odometer reading, not a guarantee (odometers cost extra: Rogers et al. 2016,
Whitehouse et al. 2023), and it is labelled so. A single release's own privacy
statement (e.g. CKS20 of its ρ) stays valid: its cost is fixed by its
parameters before it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal, localcontext

from privcal.accountant.privacy.conversions import cks20_epsilon, dstr, round_up
from privcal.accountant.privacy.filters import Policy, Spent, approx_usage, used, within_cap
from privcal.costs import fixed_context

__all__ = [
    "NEIGHBOURING",
    "NEIGHBOURING_SHORT",
    "NOT_ESTABLISHED_SHORT",
    "REALIZED_NOTE",
    "Guarantee",
    "SpentEpsilon",
    "filter_guarantee",
    "short_guarantee",
    "spent_epsilon",
]


#: how every realized-spend figure is labelled (it is an odometer reading, not a guarantee)
REALIZED_NOTE = (
    "spent so far: what these charges would guarantee had they been fixed in advance; "
    "not a guarantee under adaptive use (the dataset's guarantee is its cap's)"
)


@dataclass(frozen=True)
class Guarantee:
    """The (ε, δ) a dataset's filter guarantees for everything ever charged to it, and why."""

    epsilon: Decimal  # rounded up
    delta: Decimal
    rule: str
    #: the dataset allows non-private releases: they are outside the guarantee
    nonprivate: bool = False
    #: False when the charges so far do not pass the cap's filter check (:func:`within_cap`):
    #: then no guarantee is established — ε is +∞, δ is 1 — and ``rule`` says why
    established: bool = True

    @property
    def statement(self) -> str:
        """One sentence, with the neighbouring relation it is about (:data:`NEIGHBOURING`)."""
        if not self.established:
            return f"no privacy guarantee is established for this dataset: {self.rule}"
        if self.nonprivate:
            return (f"every private release from this dataset, however the requests adapt, "
                    f"is (with all the others) ({dstr(self.epsilon)}, {dstr(self.delta)})-DP "
                    f"[{self.rule}] {NEIGHBOURING}; its non-private releases (its policy "
                    "allows them) have no privacy guarantee")
        return (f"everything released from this dataset, however the requests adapt, is "
                f"({dstr(self.epsilon)}, {dstr(self.delta)})-DP [{self.rule}] {NEIGHBOURING}")

    @property
    def short(self) -> str:
        """One line with every qualification :attr:`statement` makes (:func:`short_guarantee`),
        or that no guarantee is established."""
        if not self.established:
            return NOT_ESTABLISHED_SHORT
        return short_guarantee(self.epsilon, self.delta, nonprivate=self.nonprivate)


#: the neighbouring relation of a dataset's guarantee. Each release states its own
#: (``privacy.neighbouring``); a composition holds for the pairs that are neighbours for every
#: release, so a release with a narrower relation narrows the whole (red team 5: LDP-CP-L
#: sends features in the clear, and a Mondrian release assumes public groups)
NEIGHBOURING = (
    "for neighbouring datasets in the sense each release states (its privacy "
    "'neighbouring', e.g. one record substituted, n public): once a release states a "
    "narrower sense (LDP-CP-L: one subject's label, features public; Mondrian: groups "
    "public), the whole holds only for datasets that are neighbours in that sense too"
)


#: :data:`NEIGHBOURING` in a few words, for the one-line forms (:func:`short_guarantee`)
NEIGHBOURING_SHORT = ("for neighbours in the sense each release states (a narrower one, e.g. "
                      "LDP-CP-L's or Mondrian's, narrows the whole)")
#: the one-line form of a guarantee that is not established
NOT_ESTABLISHED_SHORT = "none established (its charges exceed the cap's filter)"


def short_guarantee(epsilon: Decimal, delta: Decimal, *, nonprivate: bool) -> str:
    """A dataset's guarantee in one line, qualified as its full statement is: however requests
    adapt, for the neighbouring relation the releases state, and — when the dataset allows
    non-private releases — for its private releases only, the non-private ones having none.

    Every short form prints this (``budget show``, the budget summary, the web page): a bare
    "(1, 0)-DP" read as covering a non-private split threshold already published, and as
    holding for any neighbours (red team 7, F-1)."""
    eps = f"({dstr(epsilon)}, {dstr(delta)})-DP"
    if nonprivate:
        return (f"{eps} for its private releases, however requests adapt, {NEIGHBOURING_SHORT}; "
                "its non-private releases (its policy allows them) have no privacy guarantee")
    return f"{eps} however requests adapt, {NEIGHBOURING_SHORT}"


#: the context of the guarantee's own arithmetic (ε + S), whatever the caller's context is
_EXACT = fixed_context(80)  # every field given: nothing from decimal.DefaultContext
#: relative allowance for the float error of a sum of two nonnegative floats (~2 ulps)
_SUM_SLACK = 1e-12


def filter_guarantee(policy: Policy, reporting_delta: Decimal,
                     subject_epsilon: Decimal | None = None, *,
                     nonprivate: bool = False, spent: Spent | None = None) -> Guarantee:
    """The guarantee of the dataset's caps, valid at any stopping time under fully adaptive
    requests: its central cap's filter's, plus ``subject_epsilon`` if the dataset takes
    local-DP reports.

    - pure cap E: (E, 0) — basic composition filter (Rogers et al. 2016, Thm 3.6);
    - ρ-zCDP cap P: (CKS20(P, δ_r), δ_r) at the reporting δ — the transcript is P-zCDP by the
      Rényi filter (Feldman & Zrnic 2021, Thm 3.1), then one conversion (CKS20, Prop. 12) of
      a ρ fixed in advance (the *cap*, never the realized Σρ);
    - (ε, δ) cap (E, D): (E, D) — the filter over its Rényi grid
      (:mod:`privcal.accountant.privacy.filters`, with the proof).

    Local-DP reports (ldp-label, ldp-score, collection sessions) are charged per subject,
    never to the central cap: each subject's Σε0 ≤ S (``subject_epsilon``, a pure-ε filter
    per subject). So with a subject cap the releases as a whole are (ε + S, δ)-DP for one
    subject's data — the central filter's privacy loss and the local reports' (at most S,
    always) add (basic composition) — and the statement says so rather than the central
    (ε, δ) alone, which the local releases do not respect. ``nonprivate``: the dataset
    allows non-private releases, and the statement leaves them out in so many words.

    ``spent``: the dataset's totals. The filter's proof needs the final totals to pass its
    check (:func:`~privcal.accountant.privacy.filters.within_cap`); every charge accepted
    since migration 0004 keeps that true, but an (ε, δ) dataset charged before it under the
    old rule (CKS20 of the realized Σρ, not a filter) may be past its cap. Then no guarantee
    is established: the result says so, with ε = +∞ and δ = 1 (red team 6: such a dataset
    was stated "(E, D)-DP however the requests adapt").
    """
    if spent is not None and not within_cap(policy, spent):
        u = ", ".join(f"{k}={dstr(v)}" for k, v in used(policy, spent).items())
        return Guarantee(
            Decimal("Infinity"), Decimal(1),
            f"its charges so far use {u} of its cap {policy.describe()}, more than its "
            "filter allows (charges accepted before migration 0004 under the old (ε, δ) "
            "rule, which was not a filter — or a cap or total edited outside privcal, which "
            "`privcal audit verify` reports), so the cap's guarantee does not hold for them; "
            "no further charge is accepted", nonprivate=nonprivate, established=False)
    if nonprivate:
        return replace(filter_guarantee(policy, reporting_delta, subject_epsilon),
                       nonprivate=True)
    if subject_epsilon is not None:
        g = filter_guarantee(policy, reporting_delta)
        with localcontext(_EXACT):
            total = g.epsilon + subject_epsilon
        return Guarantee(
            total, g.delta,
            f"central releases: {g.rule}, ({dstr(g.epsilon)}, {dstr(g.delta)}); local-DP "
            f"reports: Σε0 ≤ {dstr(subject_epsilon)} per subject (pure-ε filter per subject, "
            "over the reports accepted: one refused — over the cap, repeated, past a full "
            "round — reached the server but is not counted; a federated "
            "agent is one subject for all its records, so a person who is also a record in "
            "an agent's data, or in two agents', counts once per id); "
            "the two added (basic composition)")
    if policy.notion == "pure":
        assert policy.epsilon is not None
        return Guarantee(policy.epsilon, Decimal(0),
                         "pure-ε filter: Σε ≤ cap (basic composition with adaptive ε, "
                         "Rogers–Roth–Ullman–Vadhan 2016)")
    if policy.notion == "zcdp":
        assert policy.rho is not None
        # cks20_epsilon is already an upper bound on the exact value (its float error bound
        # added, which a nextafter here did not cover: red team 6)
        e = round_up(cks20_epsilon(float(policy.rho), float(reporting_delta)))
        return Guarantee(e, reporting_delta,
                         "ρ-zCDP filter: Σρ ≤ cap (Feldman–Zrnic 2021), the cap converted by "
                         "CKS20 at the reporting δ")
    assert policy.epsilon is not None and policy.delta is not None
    return Guarantee(policy.epsilon, policy.delta,
                     f"(ε, δ) filter: Σε + the zCDP group converted at the best of "
                     f"{len(policy.renyi_orders)} fixed Rényi orders ≤ ε; Σδ + δ/2 ≤ δ")


@dataclass(frozen=True)
class SpentEpsilon:
    """The realized spend as (ε, δ) and its rule: not a guarantee under adaptive use.

    For a dataset that takes local-DP reports, ``epsilon`` includes the largest per-subject
    Σε0 (``subject_max``) added to the central charges' figure (``central_epsilon``)."""

    epsilon: Decimal  # rounded up
    delta: Decimal
    rule: str
    candidates: dict[str, str]  # rule → ε (rounded up) of the central charges, for transparency
    note: str = REALIZED_NOTE
    #: the central charges' ε alone (None: the dataset takes no local-DP reports)
    central_epsilon: Decimal | None = None
    #: the largest per-subject Σε0 included in ``epsilon`` (None: no local-DP reports taken)
    subject_max: Decimal | None = None


def spent_epsilon(policy: Policy, spent: Spent, reporting_delta: Decimal,
                  subject_max: Decimal | None = None, *,
                  subject_bound: bool = False) -> SpentEpsilon:
    """The realized spend as (ε, δ) at the dataset's reporting δ, local-DP reports included.

    ``spent`` holds the central charges only (local-DP reports are charged per subject, never
    to the central totals). ``subject_max``: the largest Σε0 any one subject has spent on the
    dataset's local-DP reports (None when it takes none). One subject's data then takes part
    in the central releases and in its own reports, so the realized figure for one subject is
    the central figure plus its Σε0 (basic composition) — the worst subject's, as
    :func:`filter_guarantee` adds the per-subject cap. Leaving it out printed "ε=0 (nothing
    spent)" for a dataset whose subjects had each spent 5 (red team 7, F-2).
    ``subject_bound``: ``subject_max`` is an upper bound on that largest Σε0 (the audit
    report's replay), not its exact value; the rule says "≤".
    """
    central = _central_spent(policy, spent, reporting_delta)
    if subject_max is None:
        return central
    with localcontext(_EXACT):  # exact: both are exact decimals, the first rounded up
        eps = central.epsilon + subject_max
    rel = "≤" if subject_bound else "="
    rule = (f"central charges ε={dstr(central.epsilon)}, δ={dstr(central.delta)} "
            f"({central.rule}) + local-DP reports: largest per-subject Σε0 {rel} "
            f"{dstr(subject_max)}, added (basic composition)")
    return replace(central, epsilon=eps, rule=rule, central_epsilon=central.epsilon,
                   subject_max=subject_max)


def _central_spent(policy: Policy, spent: Spent, reporting_delta: Decimal) -> SpentEpsilon:
    """The central charges' realized spend as (ε, δ): the minimum of the bounds below.

    Each candidate is a valid (ε, δ) guarantee for the charges so far *had they been fixed in
    advance*. Requests may adapt, and then the realized Σε/Σρ is an odometer reading: converting
    it (e.g. CKS20 of a realized Σρ) is not a valid guarantee (issue 14; Rogers et al. 2016,
    Whitehouse et al. 2023). The dataset's guarantee is :func:`filter_guarantee`. Candidates:

    - ``basic composition`` — Σε of pure events, δ = 0 (only when no zCDP or (ε, δ) events);
    - ``CKS20 of total ρ`` — every pure event counted as ε²/2-zCDP, plus zCDP events, converted
      with CKS20 at the reporting δ (only without (ε, δ) events);
    - ``basic composition of pure ε + CKS20 of zCDP ρ`` — the two groups composed basically;
    - for (ε, δ) budgets, the filter's own accounting of the charges so far
      (:func:`~privcal.accountant.privacy.filters.used`).
    """
    if spent.empty:
        return SpentEpsilon(Decimal(0), Decimal(0), "nothing spent", {})
    rd = float(reporting_delta)
    cands: dict[str, tuple[Decimal, Decimal]] = {}
    has_approx = spent.approx_eps > 0 or spent.approx_delta > 0
    if policy.notion == "approx" or has_approx:
        eps, delta = approx_usage(
            policy if policy.notion == "approx"
            else Policy("approx", Decimal(0), None, reporting_delta),
            spent,
        )
        cands["basic composition + Rényi-grid conversion of the zCDP group at δ/2"] = (eps, delta)
    else:
        if spent.zcdp_rho == 0:
            cands["basic composition (Σε)"] = (spent.pure_eps, Decimal(0))
        with localcontext(_EXACT):
            total_rho = float(spent.pure_rho + spent.zcdp_rho)
        cands["CKS20 of total ρ (pure ε counted as ε²/2)"] = (
            round_up(cks20_epsilon(total_rho, rd)), reporting_delta,
        )
        if spent.zcdp_rho > 0 and spent.pure_eps > 0:
            # pure group by basic composition, δ only for the zCDP group
            # each part an upper bound (float(Σε) within an ulp): the float sum and that ulp
            # within the relative allowance (a nextafter covered the sum only)
            e = float(spent.pure_eps) + cks20_epsilon(float(spent.zcdp_rho), rd)
            cands["basic composition of pure ε + CKS20 of zCDP ρ"] = (
                round_up(e + e * _SUM_SLACK), reporting_delta,
            )
    rule, (eps_d, delta_d) = min(cands.items(), key=lambda kv: (kv[1][0], kv[1][1]))
    return SpentEpsilon(eps_d, delta_d, rule, {k: dstr(v[0]) for k, v in cands.items()})
