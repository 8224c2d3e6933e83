"""Verifying that every release was paid for (red team 5, F1).

A private release must name at least one charge; each of its charges must be of its own
dataset and pay for no other release; and together they must cost at least what its
privacy record says the release cost: a central cost (ε, ρ or (ε, δ)) is covered by the
dataset-scope charges of its kind, summed; a local-DP cost ε0 by per-subject charges, each
of which charged every subject at least ε0 (each report used was paid for); a local run's
or session's ``central_cost`` (the amplified (ε, δ) of a shuffle) by dataset-scope charges
on top. A non-private release (``model`` ``none``, no cost) needs no charge.

:func:`shortfall` is the rule, applied where a release is recorded
(:func:`privcal.accountant.releases.record_release` refuses it, nothing written), by
:func:`check_release_charges` (part of :meth:`privcal.storage.verify.LedgerVerifier.verify`)
to the recorded privacy record, and by :mod:`privcal.accountant.verification` to the one it
recomputes. Verify also checks the table ``release_charges`` (which release each charge paid
for, written with every release, migration 0009) against the releases' ``charge_ids``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any

from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP, fixed_context, parse_cost
from privcal.errors import AuditFailed, PrivcalError

__all__ = ["PaidBy", "check_release_charges", "is_nonprivate", "paid_by", "reports_used",
           "shortfall"]


@dataclass(frozen=True)
class PaidBy:
    """What one charge paid: its dataset, scope and amounts (a charge row's cost columns)."""

    id: int
    dataset_id: int
    scope: str  # dataset | subjects
    notion: str  # pure | zcdp | approx | local
    epsilon: Decimal | None = None
    delta: Decimal | None = None
    rho: Decimal | None = None
    eps0: Decimal | None = None
    subjects_accepted: int | None = None  # a per-subject charge: how many it charged


def paid_by(c: Any) -> PaidBy:
    """A charge row (ORM or named tuple) as a :class:`PaidBy`."""
    return PaidBy(id=c.id, dataset_id=c.dataset_id, scope=c.scope, notion=c.notion,
                  epsilon=c.epsilon, delta=c.delta, rho=c.rho, eps0=c.eps0,
                  subjects_accepted=c.subjects_accepted)


def reports_used(shape: Any, *, federated: bool | None = None,
                 session_total: int | None = None) -> int:
    """How many reports (one per charged subject) a local-DP release used.

    A collection session's release: the reports the session accepted (``session_total``:
    one per subject and session; an ldp-score session that stops early used fewer than its
    shape's ``rounds × group_size``). A calibration run: one per row (``n``: rows of
    duplicate subjects and of subjects over their cap are dropped before the shape is taken),
    or, for a federated method, one per agent (``len(group_sizes)``). ``federated`` None (the
    storage does not know the calibrators): agents if the shape has groups, else rows — never
    more than the exact count, as every agent holds at least one row."""
    if session_total is not None:
        return int(session_total)
    shape = shape if isinstance(shape, Mapping) else {}
    groups = shape.get("group_sizes")
    if federated is None:
        federated = bool(groups)
    if federated and isinstance(groups, list | tuple):
        return len(groups)
    n = shape.get("n")
    # an n that is not a positive integer (60.0, "60": read as 60 when the guarantee is
    # recomputed) is paid for by no count: counted as more reports than any charge covers
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else _UNPAYABLE


#: the reports counted for a shape whose n is not a positive integer (never paid for)
_UNPAYABLE = 2**63


#: exact sums of squares of stored amounts (≤ 30 decimals each)
_EXACT = fixed_context(80)


def _d(x: Decimal | None) -> Decimal:
    return Decimal(0) if x is None else Decimal(x)


def _plain(d: Decimal) -> str:
    return format(d.normalize(), "f") if d else "0"


def is_nonprivate(privacy: Any) -> bool:
    """Whether a release's privacy record says it is non-private (``model`` ``none`` or
    absent, no cost): allowed only on a dataset made with ``allow_nonprivate``."""
    return (isinstance(privacy, Mapping) and privacy.get("cost") is None
            and privacy.get("central_cost") is None and privacy.get("model") in (None, "none"))


def shortfall(privacy: Any, charges: Sequence[Any], reports: int = 0, *,
              zcdp_parts: Sequence[Decimal] | None = None) -> str | None:
    """Why ``charges`` (each with ``id``, ``scope``, ``notion``, ``epsilon``, ``delta``,
    ``rho``, ``eps0``, ``subjects_accepted``) do not pay for a release whose privacy record is
    ``privacy`` and which used ``reports`` local reports (:func:`reports_used`), as the end of
    a sentence about the release; None if they do (module docstring).

    ``zcdp_parts``: the release is on a ρ-zCDP cap, and these are the ε of the pure ε-DP
    mechanisms its pure cost composes (one, or a wrapper's separately charged runs:
    :func:`privcal.calibrators.cost_parts.cost_parts`). Such a cap counts a pure charge of ε
    as ε²/2 (Bun & Steinke 2016, Prop. 1.4), which is not additive: three charges of ε = 1
    count ρ = 1.5, and one 3-DP mechanism is only known to be 4.5-zCDP. So the pure charges
    must also count Σεᵢ²/2 ≥ Σ_parts ε²/2 (red team 26, privacy F1: a single 3-DP release
    recorded with three PureDP(1) charges verified, its cap's guarantee fed 1.5 for 4.5).
    Storage cannot tell the parts (the calibrators can); the accountant gives them where it
    records a release and where ``audit verify`` recomputes it."""
    if not isinstance(privacy, Mapping):
        return "has a privacy record that is not an object"
    cost_doc, central_doc = privacy.get("cost"), privacy.get("central_cost")
    if is_nonprivate(privacy):
        return None  # non-private: nothing to pay
    if not charges:
        return "is private but names no charge that paid for it"
    try:
        cost = parse_cost(cost_doc) if cost_doc is not None else None  # type: ignore[arg-type]
        central = parse_cost(central_doc) if central_doc is not None else None  # type: ignore[arg-type]
    except (PrivcalError, ValueError, TypeError):
        return "has a privacy cost that cannot be read"
    if central is not None and isinstance(central, LocalDP):
        return "records a local-DP central_cost"
    ids = [c.id for c in charges]
    if isinstance(cost, LocalDP):
        local = [c for c in charges if c.scope == "subjects" and c.notion == "local"]
        if not local:
            return (f"costs ε0 = {_plain(cost.eps0)} per subject, but none of its charges "
                    f"{ids} is a per-subject charge")
        low = [c for c in local if _d(c.eps0) < cost.eps0]
        if low:
            return (f"costs ε0 = {_plain(cost.eps0)} per subject, but charge {low[0].id} "
                    f"charged each subject ε0 = {_plain(_d(low[0].eps0))}")
        charged = sum(int(c.subjects_accepted or 0) for c in local)
        if charged < reports:
            return (f"used {reports} reports, one per subject, but its per-subject charges "
                    f"{[c.id for c in local]} charged {charged} subjects in all")
    need = {"pure": [Decimal(0)], "zcdp": [Decimal(0)], "approx": [Decimal(0), Decimal(0)]}
    wanted = False
    for c in (cost, central):
        if isinstance(c, PureDP):
            need["pure"][0] += c.eps
        elif isinstance(c, ZCDP):
            need["zcdp"][0] += c.rho
        elif isinstance(c, ApproxDP):
            need["approx"][0] += c.eps
            need["approx"][1] += c.delta
        else:
            continue
        wanted = True
    if not wanted:
        return None
    got = {"pure": [Decimal(0)], "zcdp": [Decimal(0)], "approx": [Decimal(0), Decimal(0)]}
    central_ids: dict[str, list[int]] = {k: [] for k in got}
    for c in charges:
        if c.scope != "dataset" or c.notion not in got:
            continue
        central_ids[c.notion].append(c.id)
        if c.notion == "pure":
            got["pure"][0] += _d(c.epsilon)
        elif c.notion == "zcdp":
            got["zcdp"][0] += _d(c.rho)
        else:
            got["approx"][0] += _d(c.epsilon)
            got["approx"][1] += _d(c.delta)
    names = {"pure": ("ε",), "zcdp": ("ρ",), "approx": ("ε", "δ")}
    for kind, want in need.items():
        if not any(want):
            continue
        if not central_ids[kind]:
            what = ", ".join(f"{n} = {_plain(w)}" for n, w in zip(names[kind], want, strict=True))
            return (f"costs {what} ({kind}), but none of its charges {ids} is a {kind} charge "
                    "of the dataset")
        for n, w, g in zip(names[kind], want, got[kind], strict=True):
            if g < w:
                return (f"costs {n} = {_plain(w)} ({kind}), but its charges "
                        f"{central_ids[kind]} cost {n} = {_plain(g)} in all")
    if zcdp_parts is not None and isinstance(cost, PureDP):
        with localcontext(_EXACT):
            need = sum((Decimal(e) * Decimal(e) / 2 for e in zcdp_parts), Decimal(0))
            paid = sum((_d(c.epsilon) * _d(c.epsilon) / 2 for c in charges
                        if c.scope == "dataset" and c.notion == "pure"), Decimal(0))
        if paid < need:
            return (f"is {_plain(cost.eps)}-DP, ρ = {_plain(need)} on its ρ-zCDP cap (ε-DP is "
                    f"ε²/2-zCDP per mechanism run), but its pure charges "
                    f"{central_ids['pure']} count ρ = {_plain(paid)} in all (Σεᵢ²/2: several "
                    "smaller pure charges count less than one of their sum)")
    return None


def check_release_charges(releases: Mapping[int, Any], charges: Mapping[int, Any],
                          seqs: Mapping[int, int], links: Mapping[int, int] | None = None,
                          sessions: Mapping[int, Any] | None = None,
                          charge_seqs: Mapping[int, int] | None = None,
                          nonprivate_ok: Mapping[int, bool] | None = None,
                          datasets: Mapping[int, Any] | None = None) -> list[int]:
    """Every release row paid for by charges of its own dataset that pay for no other
    release, costing at least its recorded privacy cost (:func:`shortfall`; a local release
    by as many subjects as it used reports: ``sessions``, the collection session rows, give a
    session's release the reports its session accepted); and ``links`` (the rows of
    ``release_charges``: charge id → release id) exactly the charges the releases name; and
    (``charge_seqs``: charge id → seq of its audit entry) every charge logged *before* the
    release it pays for — privcal charges, then releases, so a release whose entry precedes a
    charge it names was recorded unpaid, with that charge added later (red team 18, auditor
    F9); and (``nonprivate_ok``: dataset id → its ``allow_nonprivate``) a non-private
    release only on a dataset that allows them — its cap's stated guarantee leaves them out
    only there (red team 23, ledger F8). AuditFailed naming the release's audit entry
    (``seqs``: release id → seq) otherwise.

    Returns the releases the storage cannot decide (``datasets``: dataset id → its row, whose
    ``notion`` is its cap's): pure-cost releases on a ρ-zCDP cap whose pure charges'
    Σεᵢ²/2 is less than the whole cost's ε²/2 — paid for only if the release composes
    separately charged runs (:func:`shortfall`'s ``zcdp_parts``, the calibrators' to tell);
    the accountant's verification recomputes them, ``Ledger.sign_head`` refuses them (red
    team 26, payrule F1)."""
    totals = {c.release_id: int((c.state or {}).get("total", 0))
              for c in (sessions or {}).values() if c.release_id is not None}
    owner: dict[int, int] = {}
    undecided: list[int] = []
    for rid, r in sorted(releases.items()):
        where = f"audit entry {seqs.get(rid, 0)}: release {rid}"
        ids = r.charge_ids
        if not isinstance(ids, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise AuditFailed(f"{where}: its charge_ids are not a list of charge ids")
        if r.charge_id != (ids[0] if ids else None) or len(set(ids)) != len(ids):
            raise AuditFailed(f"{where}: its charge_id is not the first of its charge_ids, or "
                              "a charge is named twice")
        for cid in ids:
            c = charges.get(cid)
            if c is None:
                raise AuditFailed(f"{where}: charge {cid} is missing from the ledger")
            if c.dataset_id != r.dataset_id:
                raise AuditFailed(f"{where}: charge {cid} is a charge of another dataset "
                                  "(it paid nothing towards this dataset's release)")
            if cid in owner:
                raise AuditFailed(f"{where}: charge {cid} already paid for release "
                                  f"{owner[cid]} (a charge pays for one release)")
            owner[cid] = rid
            logged = None if charge_seqs is None else charge_seqs.get(cid)
            if logged is not None and rid in seqs and logged > seqs[rid]:
                raise AuditFailed(f"{where}: charge {cid} is logged after it (audit entry "
                                  f"{logged}); a release is paid for before it is recorded")
        if nonprivate_ok is not None and is_nonprivate(r.privacy) and \
                not nonprivate_ok.get(r.dataset_id, False):
            raise AuditFailed(f"{where} is non-private, but its dataset does not allow "
                              "non-private releases (its stated guarantee would not hold)")
        why = shortfall(r.privacy, [charges[i] for i in ids],
                        reports_used(r.shape, session_total=totals.get(rid)))
        if why is not None:
            raise AuditFailed(f"{where} {why} (not paid for)")
        ds = (datasets or {}).get(r.dataset_id)
        whole = _pure_eps(r.privacy) if getattr(ds, "notion", None) == "zcdp" else None
        if whole is not None and shortfall(r.privacy, [charges[i] for i in ids],
                                           zcdp_parts=[whole]) is not None:
            undecided.append(rid)
    if links is None:
        return undecided
    for cid in sorted(set(owner) | set(links)):
        if cid not in links:  # say which edit it was (red team 23, ledger F4)
            raise AuditFailed(f"release_charges: charge {cid} pays for release {owner[cid]} "
                              "(its charge_ids) but has no release_charges row (row deleted "
                              "outside privcal)")
        if cid not in owner:
            raise AuditFailed(f"release_charges: a row says charge {cid} pays for release "
                              f"{links[cid]}, but no release names it (row inserted outside "
                              "privcal)")
        if links.get(cid) != owner.get(cid):
            raise AuditFailed(
                f"release_charges: charge {cid} is recorded as paying for release "
                f"{links.get(cid)}, but the releases' charge_ids say "
                f"{owner.get(cid)} (row altered, deleted or inserted outside privcal)")
    return undecided


def _pure_eps(privacy: Any) -> Decimal | None:
    """The ε of a privacy record's pure cost; None for any other (or an unreadable) one."""
    doc = privacy.get("cost") if isinstance(privacy, Mapping) else None
    try:
        cost = parse_cost(doc) if isinstance(doc, Mapping) else None  # type: ignore[arg-type]
    except (PrivcalError, ValueError, TypeError):
        return None
    return cost.eps if isinstance(cost, PureDP) else None
