"""A model-based (stateful) test of the privacy ledger through the Python API.

Fixed-example tests check one charge or one replay at a time; the bugs that survive them
live in *sequences*: a replay after the budget ran out, a key reused by another kind of
request, a refusal that leaves a row behind, a second process whose cached view of a
dataset (PostgreSQL's optimistic one-round-trip charge keeps a snapshot per process) is
stale, a cap hit exactly after many tiny charges rounded up to 12 places. Here a
:class:`hypothesis.stateful.RuleBasedStateMachine` drives random interleavings of
``create_dataset`` (pure ε, zCDP ρ and (ε, δ) caps, with and without a per-subject cap),
``charge`` (every central cost kind; amounts that hit the cap exactly, just above it, far
below it, below the 12-place quantum; as str, float, Decimal and NumPy floats; with and
without idempotency keys, replayed with the same and with another request),
``charge_subjects`` (local DP), cheap calibrations (``split``, ``pcoqs``, ``exponq`` on 20
seeded scores; a saved release loaded back), operations refused on purpose (unknown
dataset, amounts 0, negative, NaN, ∞, text, costs built without validation) — through TWO
:class:`~privcal.Accountant` objects on one ledger, used alternately, as two processes
would be, and at once from two threads (charges of one dataset; one keyed calibration). Two
rules aim at the edges random draws rarely hit: A charges, B charges (A's PostgreSQL
snapshot is now stale), A asks for one quantum more than is left, then exactly what is left;
and a subject filled to its cap by A and B, then refused one quantum more. Every fresh
calibration is first priced by the other accountant's dry run, which must write nothing and
agree with the run. The caller's decimal context is made hostile once per example.

A reference model keeps every exact quantity as a :class:`fractions.Fraction`: each cost
rounded *up* to 12 decimal places (the documented rule, ``privcal.accountant.normalize``),
Σε against a pure cap, Σρ + Σε²/2 against a zCDP cap, every subject's Σε0 against its
cap. After every step it checks:

1. no overspend: a pure or zCDP charge is accepted iff the model says it fits, exactly;
   under an (ε, δ) cap an accepted state passes the Rényi filter recomputed independently
   in 60-digit decimals (and a refusal is only allowed when the filter, with the
   documented rounding up of g(R) to 6 digits, says it does not fit), and the reported
   guarantee is the cap;
2. a refused or failed operation changes nothing: audit head, charges, releases, totals;
3. every dataset's reported spent, remaining, charge and release counts equal the model's;
4. an idempotent replay returns the same receipt or release and changes nothing; a reused
   key with another request is refused and changes nothing;
5. every few steps and at teardown ``Accountant.verify()`` passes, and the audit chain has
   grown by exactly one entry per dataset, charge and release accepted.

CI runs a short derandomized exploration per backend (SQLite, and PostgreSQL when
$PRIVCAL_TEST_DATABASE_URL is set, through ``tests/conftest.py``'s ``ledger_url``: one
migrated ledger per backend, each example with datasets of its own). A long randomized hunt:
``PRIVCAL_STATEFUL_SEED=7 PRIVCAL_STATEFUL_EXAMPLES=40 PRIVCAL_STATEFUL_STEPS=75 pytest -s
tests/test_stateful_ledger.py`` (any seed; unset = derandomized; ``PRIVCAL_STATEFUL_STATS=1``
prints what the run did, ``PRIVCAL_STATEFUL_SHRINK=1`` shrinks a failure — off by default, it
takes minutes on a ledger; a failing step prints its trail and traceback itself).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
import sys
import traceback
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import event as _event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import func, select

from privcal import Accountant
from privcal.accountant.calibration import dry_run as price
from privcal.accountant.results import Release
from privcal.costs import ZCDP, ApproxDP, LocalDP, PureDP, fixed_context
from privcal.errors import AlreadyExists, BudgetRefused, InvalidInput, NotFound, PrivcalError
from privcal.storage import Ledger
from privcal.storage.models import Charge, ReleaseRow
from tests.seeded import Seeded

Q = 10 ** 12  # amounts are stored with 12 decimal places (privcal.accountant.normalize)
ONE_Q = Fraction(1, Q)
_EXAMPLES = int(os.environ.get("PRIVCAL_STATEFUL_EXAMPLES", "8"))
_STEPS = int(os.environ.get("PRIVCAL_STATEFUL_STEPS", "30"))
_SEED = os.environ.get("PRIVCAL_STATEFUL_SEED")
_SHRINK = os.environ.get("PRIVCAL_STATEFUL_SHRINK", "0") == "1"
_VERIFY_EVERY = int(os.environ.get("PRIVCAL_STATEFUL_VERIFY_EVERY", "8"))
_CTX = fixed_context(60)
#: what the runs did, printed with PRIVCAL_STATEFUL_STATS=1 (pytest -s)
STATS: Counter[str] = Counter()


def event(what: str) -> None:
    STATS[what] += 1
    _event(what)


# ------------------------------------------------------------------ exact helpers
def up12(x: Fraction) -> Fraction:
    """``x`` rounded up to 12 decimal places (what privcal charges for a cost amount)."""
    return Fraction(math.ceil(x * Q), Q)


def frac(d: Decimal | str) -> Fraction:
    return Fraction(Decimal(d))


def dec(x: Fraction) -> Decimal:
    """An exact Fraction with a finite decimal expansion (≤ 40 places) as a Decimal."""
    with localcontext(_CTX):
        d = Decimal(x.numerator) / Decimal(x.denominator)
    assert Fraction(d) == x, x
    return d


def given_value(raw: Any) -> Fraction:
    """The exact amount a cost holds for what the caller passed (a float is its shortest
    repr, as ``privcal.costs`` documents)."""
    if isinstance(raw, float | np.floating):
        return Fraction(Decimal(repr(float(raw))))
    return Fraction(Decimal(str(raw)))


def renyi_g(rho: Fraction, cap_delta: Fraction, orders: list[Decimal]) -> Decimal:
    """g(R) of the (ε, δ) filter (privcal/accountant/privacy/filters.py docstring),
    recomputed independently in 50-digit decimals: min over the grid of
    aR + (ln(1/δ') − ln a + (a − 1)·ln(1 − 1/a))/(a − 1), δ' = D/(2|A|)."""
    if rho == 0:
        return Decimal(0)
    with localcontext(_CTX):
        d_each = dec(cap_delta) / 2 / len(orders)
        lid = (1 / d_each).ln()
        r = dec(rho)
        best = None
        for a in orders:
            am1 = a - 1
            v = a * r + (lid - a.ln() + am1 * (1 - 1 / a).ln()) / am1
            best = v if best is None or v < best else best
        assert best is not None
        return max(best, Decimal(0))


# ------------------------------------------------------------------ the model
@dataclass
class KeyUse:
    """What an idempotency key of a dataset was first used for."""

    kind: str  # charge | subjects | calibrate
    request: tuple[Any, ...]
    charge_id: int | None = None
    receipt: Any = None
    release_id: int | None = None


@dataclass
class DS:
    """The model of one dataset."""

    name: str
    notion: str  # pure | zcdp | approx
    cap_eps: Fraction | None = None
    cap_rho: Fraction | None = None
    cap_delta: Fraction | None = None
    subject_cap: Fraction | None = None
    nonprivate: bool = False
    orders: list[Decimal] = field(default_factory=list)
    pure_eps: Fraction = Fraction(0)
    pure_rho: Fraction = Fraction(0)
    zcdp_rho: Fraction = Fraction(0)
    approx_eps: Fraction = Fraction(0)
    approx_delta: Fraction = Fraction(0)
    charges: int = 0
    releases: int = 0
    keys: dict[str, KeyUse] = field(default_factory=dict)
    release_keys: dict[str, KeyUse] = field(default_factory=dict)  # split's (release_keys)
    subjects: dict[str, Fraction] = field(default_factory=dict)
    refused_keys: list[str] = field(default_factory=list)  # bound nothing: free to reuse

    # ---- the filters, exactly
    def fits(self, kind: str, eps: Fraction, rho: Fraction, delta: Fraction) -> bool | None:
        """Whether a central cost fits (None: an (ε, δ) cap, decided by :meth:`approx_fits`)."""
        if self.notion == "pure":
            return kind == "pure" and self.pure_eps + eps <= self.cap_eps
        if self.notion == "zcdp":
            if kind == "approx":
                return False
            add = eps * eps / 2 if kind == "pure" else rho
            assert self.cap_rho is not None
            return self.pure_rho + self.zcdp_rho + add <= self.cap_rho
        return None

    def after(self, kind: str, eps: Fraction, rho: Fraction, delta: Fraction
              ) -> tuple[Fraction, Fraction, Fraction]:
        """(ε_p, R, Δ) of an (ε, δ) cap after one more cost."""
        ep, r, d = self.pure_eps + self.approx_eps, self.zcdp_rho, self.approx_delta
        if kind == "pure":
            ep += eps
        elif kind == "zcdp":
            r += rho
        else:
            ep, d = ep + eps, d + delta
        return ep, r, d

    def approx_usage(self, ep: Fraction, r: Fraction, d: Fraction) -> tuple[Decimal, Fraction]:
        assert self.cap_delta is not None
        g = renyi_g(r, self.cap_delta, self.orders)
        with localcontext(_CTX):
            e_used = dec(ep) + g
        return e_used, d + (self.cap_delta / 2 if r > 0 else 0)

    def approx_verdict(self, kind: str, eps: Fraction, rho: Fraction, delta: Fraction) -> str:
        """'fits', 'over' or 'edge' (within the documented rounding of g(R): either is fine)."""
        assert self.cap_eps is not None and self.cap_delta is not None
        ep, r, d = self.after(kind, eps, rho, delta)
        e_used, d_used = self.approx_usage(ep, r, d)
        if d_used > self.cap_delta:
            return "over"
        cap = dec(self.cap_eps)
        if e_used > cap:
            return "over"
        # privcal rounds g up: float slack 1e-12 (relative and absolute), 6 significant digits
        with localcontext(_CTX):
            g = e_used - dec(ep)
            g_hi = g * (1 + Decimal("2e-5")) + Decimal("1e-11")
            if dec(ep) + g_hi <= cap:
                return "fits"
        return "edge"

    def add(self, kind: str, eps: Fraction, rho: Fraction, delta: Fraction) -> None:
        if kind == "pure":
            self.pure_eps += eps
            self.pure_rho += eps * eps / 2
        elif kind == "zcdp":
            self.zcdp_rho += rho
        else:
            self.approx_eps += eps
            self.approx_delta += delta

    def remaining_exact(self) -> Fraction | None:
        if self.notion == "pure":
            assert self.cap_eps is not None
            return max(Fraction(0), self.cap_eps - self.pure_eps)
        if self.notion == "zcdp":
            assert self.cap_rho is not None
            return max(Fraction(0), self.cap_rho - self.pure_rho - self.zcdp_rho)
        return None


@dataclass
class Snap:
    """What must not change across a refused operation."""

    head: str
    budgets: dict[str, tuple[Any, ...]]


# ------------------------------------------------------------------ strategies
PURE_CAPS = ["1", "0.5", "0.000000000003", "2.5", "0.3"]
RHO_CAPS = ["0.1", "1", "0.000000000002", "0.05"]
APPROX_CAPS = [("1", "0.000001"), ("3", "0.00001"), ("0.5", "0.000000001"), ("10", "0.001")]
ORDERS = [None, "2,4,8", "1.5", "2,33,1025"]
AMOUNT_MODES = ["exact", "above", "above13", "below13", "far_below", "tiny", "sub_quantum",
                "float", "half", "big"]
FORMS = ["str", "float", "decimal", "numpy", "numpy32", "sci"]
BAD_AMOUNTS: list[Any] = [0, -1, "-0.5", float("nan"), float("inf"), "inf", "NaN", "abc",
                          "", "1_0", True, None, [0.1], "0x10", "1e99999", 1e15]


def _as_form(x: Fraction, form: str) -> Any:
    d = dec(x)
    if form == "str":
        return format(d, "f")
    if form == "decimal":
        return d
    if form == "sci":  # "1E-12", "2.5E+1": Decimal's scientific spelling
        return str(d.normalize(_CTX))
    f = float(d)
    if form == "numpy32":  # holds 0.10000000149011612 for 0.1: charged as that (red team 7)
        return np.float32(f)
    return np.float64(f) if form == "numpy" else f

#: the arguments of a central charge (two rules draw them: charges are most of a run)
CHARGE_ARGS: dict[str, st.SearchStrategy[Any]] = {
    "which": st.integers(0, 100), "who": st.integers(0, 1),
    "kind": st.sampled_from(["pure", "zcdp", "approx"]),
    "mode": st.sampled_from(AMOUNT_MODES), "form": st.sampled_from(FORMS),
    "keyed": st.sampled_from(["none", "new", "replay", "other", "refused"]),
    "delta_mode": st.integers(0, 5), "purpose": st.sampled_from([None, "p1", "p2"]),
    "r": st.randoms(use_true_random=False),
}



def _step(f: Any) -> Any:
    """Mark the machine failed when a step raises, so that teardown does not bury the
    step's error under a second one from its final verify."""

    @functools.wraps(f)
    def wrapper(self: LedgerMachine, *args: Any, **kwargs: Any) -> Any:
        if f.__name__ not in ("budgets_match_model", "head_matches"):
            self.trail.append(f"{f.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})")
        try:
            return f(self, *args, **kwargs)
        except BaseException:
            if not self.failed:  # printed as it happens: a concurrent rule's outcome can make
                # hypothesis's replay of the example draw differently (FlakyStrategyDefinition),
                # which would hide this error
                print("\n== the step that failed, after:\n  " + "\n  ".join(self.trail))
                traceback.print_exc(file=sys.stdout)
            self.failed = True
            raise

    return wrapper


class LedgerMachine(RuleBasedStateMachine):
    """The machine; :func:`_run` sets ``URL`` (one migrated ledger per test function)."""

    URL: ClassVar[str] = ""
    _names: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.accts: list[Accountant] = []
        self.ds: dict[str, DS] = {}
        self.steps = 0
        self.key_counter = itertools.count()
        self.seen_charge_ids: set[int] = set()
        self.seen_release_ids: set[int] = set()
        self.failed = False
        self.hostile = False
        self.trail: list[str] = []

    # ------------------------------------------------------------ setup
    @initialize()
    @_step
    def open(self) -> None:
        self.accts = [Accountant(Ledger(self.URL)), Accountant(Ledger(self.URL))]
        # the ledger is the test function's, shared by its examples (each its own datasets):
        # start from what earlier examples left, counted directly (not by a verify, which
        # an earlier failing example may have made fail: hypothesis replays a failure)
        led = self.accts[0].ledger
        self.entries = led.head().seq
        with led.read() as s:
            self.charges_total = s.scalar(select(func.count()).select_from(Charge)) or 0
            self.releases_total = s.scalar(select(func.count()).select_from(ReleaseRow)) or 0

    def teardown(self) -> None:
        try:
            if self.accts and not self.failed:
                self._verify()
        finally:
            for a in self.accts:
                a.close()
            _restore_decimal()

    # ------------------------------------------------------------ helpers
    def _acct(self, i: int) -> Accountant:
        return self.accts[i % 2]

    def _pick(self, i: int) -> DS:
        names = list(self.ds)  # in creation order (names carry a global counter)
        return self.ds[names[i % len(names)]]

    def _new_key(self) -> str:
        return f"k-{next(self.key_counter)}"

    def _budget_tuple(self, name: str) -> tuple[Any, ...]:
        b = self.accts[0].budget(name)
        return (b.spent, b.remaining, b.charges, b.releases, b.guarantee.epsilon,
                b.guarantee.delta)

    def _snap(self) -> Snap:
        return Snap(str(self.accts[1].ledger.head()),
                    {n: self._budget_tuple(n) for n in self.ds})

    def _unchanged(self, before: Snap, what: str) -> None:
        after = self._snap()
        assert after.head == before.head, f"{what}: the audit head moved on a refusal"
        assert after.budgets == before.budgets, f"{what}: a dataset changed on a refusal"

    def _verify(self) -> None:
        rep = self.accts[self.steps % 2].verify()
        assert rep.entries == self.entries, (rep.entries, self.entries)
        assert rep.charges == self.charges_total, (rep.charges, self.charges_total)
        assert rep.releases == self.releases_total, (rep.releases, self.releases_total)
        assert rep.head == str(self.accts[0].ledger.head())

    def _new_charge_id(self, cid: int) -> None:
        assert cid not in self.seen_charge_ids, f"charge id {cid} given twice"
        self.seen_charge_ids.add(cid)

    def _charged(self, m: DS, cid: int | None, cost: tuple[Any, ...] | None = None) -> None:
        """One accepted charge of ``m`` in the model: its id new (if known), its central cost
        (kind, ε, ρ, δ) added if given, and one more charge and log entry counted."""
        if cid is not None:
            self._new_charge_id(cid)
        if cost is not None:
            m.add(*cost)
        m.charges += 1
        self.entries += 1
        self.charges_total += 1

    def _amount(self, m: DS, mode: str, target: Fraction, rnd: random.Random) -> Fraction:
        """An amount (before rounding) aimed at ``target`` (what is left, in the cost's unit)."""
        if mode == "exact":
            return target if target > 0 else ONE_Q
        if mode == "above":
            return target + ONE_Q
        if mode == "above13":
            return target + Fraction(1, 10 * Q)
        if mode == "below13":
            return max(target - Fraction(1, 10 * Q), Fraction(1, 10 * Q))
        if mode == "far_below":
            return max(up12(target / rnd.choice([3, 7, 10, 1000])), ONE_Q)
        if mode == "tiny":
            return ONE_Q
        if mode == "sub_quantum":
            return Fraction(rnd.choice([1, 3, 9]), 10 * Q)
        if mode == "float":
            return given_value(rnd.choice([0.1, 0.2, 0.3, 0.7, 1 / 3, 1e-12, 2.5e-13]))
        if mode == "half":
            return max(up12(target / 2), ONE_Q)
        return Fraction(rnd.choice([10, 1000, 10 ** 9]))

    # ------------------------------------------------------------ rules
    @precondition(lambda self: len(self.ds) < 5)
    @rule(kind=st.sampled_from(["pure", "zcdp", "approx"]), cap=st.integers(0, 100),
          orders=st.sampled_from(ORDERS), subject=st.sampled_from([None, "1", "0.5"]),
          nonprivate=st.booleans(), who=st.integers(0, 1))
    @_step
    def create_dataset(self, kind: str, cap: int, orders: str | None, subject: str | None,
                       nonprivate: bool, who: int) -> None:
        name = f"d{next(self._names)}-{kind}"
        kw: dict[str, Any] = {"subject_epsilon": subject, "allow_nonprivate": nonprivate}
        m = DS(name=name, notion=kind, nonprivate=nonprivate,
               subject_cap=frac(subject) if subject else None)
        if kind == "pure":
            c = PURE_CAPS[cap % len(PURE_CAPS)]
            kw["epsilon"], m.cap_eps = c, frac(c)
        elif kind == "zcdp":
            c = RHO_CAPS[cap % len(RHO_CAPS)]
            kw["rho"], m.cap_rho = c, frac(c)
        else:
            e, d = APPROX_CAPS[cap % len(APPROX_CAPS)]
            kw["approx_epsilon"], kw["approx_delta"] = e, d
            m.cap_eps, m.cap_delta = frac(e), frac(d)
            if orders is not None:
                kw["renyi_orders"] = orders
        info = self._acct(who).create_dataset(name, **kw)
        assert info.notion == kind
        if kind == "approx":
            assert info.renyi_orders is not None
            m.orders = [Decimal(a) for a in info.renyi_orders]
            if orders is not None:
                assert m.orders == sorted(Decimal(a) for a in orders.split(","))
        self.ds[name] = m
        self.entries += 1
        # the same name again: refused, nothing written
        before = self._snap()
        with pytest.raises(AlreadyExists):
            self._acct(who + 1).create_dataset(name, **kw)
        self._unchanged(before, "create_dataset of a taken name")

    @precondition(lambda self: bool(self.ds))
    @rule(**CHARGE_ARGS)
    @_step
    def charge(self, **kw: Any) -> None:
        self._charge(**kw)

    @precondition(lambda self: bool(self.ds))
    @rule(**CHARGE_ARGS)
    @_step
    def charge_more(self, **kw: Any) -> None:  # the same rule again: charges twice as often
        self._charge(**kw)

    def _charge(self, which: int, who: int, kind: str, mode: str, form: str, keyed: str,
                delta_mode: int, purpose: str | None, r: random.Random) -> None:
        m = self._pick(which)
        acct = self._acct(who)
        # ---- replaying or misusing a key of this dataset
        charge_keys = [k for k, u in m.keys.items()]
        if keyed in ("replay", "other") and charge_keys:
            key = r.choice(charge_keys)
            use = m.keys[key]
            if use.kind == "charge" and keyed == "replay":
                k_kind, k_amounts, k_purpose = use.request
                cost = _cost(k_kind, *k_amounts, form=r.choice(FORMS))
                before = self._snap()
                if _charged(cost) != k_amounts:  # a float form changed the amount (float32)
                    with pytest.raises(InvalidInput, match="idempotency key"):
                        acct.charge(m.name, cost, purpose=k_purpose, idempotency_key=key)
                    self._unchanged(before, "a replay whose amount changed")
                    event("charge: replay in a lossy form refused")
                    return
                rec = acct.charge(m.name, cost, purpose=k_purpose, idempotency_key=key)
                assert rec.replayed, rec
                event("charge: replayed")
                old = use.receipt
                assert (rec.charge_id, rec.cost, rec.purpose, rec.idempotency_key,
                        rec.created_at) == (old.charge_id, old.cost, old.purpose,
                                            old.idempotency_key, old.created_at)
                self._unchanged(before, "an idempotent replay")
                assert rec.remaining == self.accts[0].budget(m.name).remaining, rec
                return
            # a different request under a taken key: another amount or purpose
            cost = _cost("pure", ONE_Q * 7, Fraction(0), Fraction(0), form="str")
            if use.kind == "charge" and use.request[0] == "pure" and \
                    use.request[1][0] == 7 * ONE_Q and use.request[2] is None:
                cost = _cost("pure", ONE_Q * 8, Fraction(0), Fraction(0), form="str")
            before = self._snap()
            event(f"charge: key reused for another request ({use.kind})")
            with pytest.raises(InvalidInput, match="idempotency key"):
                acct.charge(m.name, cost, idempotency_key=key)
            self._unchanged(before, "a reused key with another request")
            return
        # ---- a fresh request
        if kind == "approx" and m.notion != "approx" and r.random() < 0.7:
            kind = m.notion  # mostly charge what the cap takes
        eps = rho = delta = Fraction(0)
        if m.notion == "pure":
            left = m.remaining_exact() or Fraction(0)
        elif m.notion == "zcdp":
            left = m.remaining_exact() or Fraction(0)
            if kind == "pure":  # ε with ε²/2 ≈ what is left
                root = Decimal(math.sqrt(2 * float(left)))
                left = Fraction(root.quantize(Decimal("1e-12"), context=_CTX))
        else:
            b = self.accts[0].budget(m.name)
            left = frac(b.remaining["epsilon"])
            if kind == "zcdp":
                left = left / 20
        amount = self._amount(m, mode, left, r)
        if kind == "pure":
            eps = amount
        elif kind == "zcdp":
            rho = amount
        else:
            eps = amount if r.random() < 0.8 else Fraction(0)
            assert m.cap_delta is not None or True
            cd = m.cap_delta if m.cap_delta is not None else Fraction(1, 10 ** 6)
            left_d = cd - m.approx_delta - (cd / 2 if m.zcdp_rho > 0 else 0)
            delta = [Fraction(0), up12(cd / 2), cd, max(left_d, Fraction(0)),
                     left_d + ONE_Q, Fraction(1, 10 ** 13)][delta_mode]
            if delta < 0:
                delta = Fraction(0)
        key = None
        if keyed == "refused" and m.refused_keys:  # a key whose request was refused
            key = m.refused_keys.pop()
        elif keyed != "none":
            key = self._new_key()
        raw_eps = _as_form(eps, form) if eps else eps
        cost = _cost(kind, eps, rho, delta, form=form, raw=raw_eps)
        # what the cost holds, then what privcal charges: rounded up to 12 places
        held_eps = given_value(cost.eps) if kind in ("pure", "approx") else Fraction(0)
        held_rho = given_value(cost.rho) if kind == "zcdp" else Fraction(0)
        c_eps, c_rho, c_delta = up12(held_eps), up12(held_rho), up12(delta)
        verdict: bool | str | None = m.fits(kind, c_eps, c_rho, c_delta)
        if verdict is None:
            verdict = m.approx_verdict(kind, c_eps, c_rho, c_delta)
        before = self._snap()
        try:
            rec = acct.charge(m.name, cost, purpose=purpose, idempotency_key=key)
        except BudgetRefused:
            event(f"charge: refused ({m.notion}, {kind}, {mode}, {verdict})")
            assert verdict in (False, "over", "edge"), (
                f"refused a charge the model says fits: {cost!r} on {m}")
            self._unchanged(before, "a refused charge")
            if key is not None:
                m.refused_keys.append(key)
            return
        assert verdict in (True, "fits", "edge"), (
            f"OVERSPEND: accepted {cost!r} on {m.name} ({m.notion}); model totals "
            f"pure_eps={m.pure_eps} pure_rho={m.pure_rho} zcdp_rho={m.zcdp_rho} "
            f"approx=({m.approx_eps}, {m.approx_delta}) cap=({m.cap_eps}, {m.cap_rho}, "
            f"{m.cap_delta})")
        event(f"charge: accepted ({m.notion}, {kind}, {mode}, {verdict})")
        assert not rec.replayed
        self._charged(m, rec.charge_id, (kind, c_eps, c_rho, c_delta))
        if key is not None:
            m.keys[key] = KeyUse("charge", (kind, (c_eps, c_rho, c_delta), purpose),
                                 charge_id=rec.charge_id, receipt=rec)
        assert rec.remaining == self.accts[0].budget(m.name).remaining, rec
        if m.notion != "approx":
            left_now = m.remaining_exact()
            assert left_now is not None
            unit = "epsilon" if m.notion == "pure" else "rho"
            assert frac(rec.remaining[unit]) == left_now, (rec.remaining, left_now)
        else:
            ep, rr, dd = m.after("pure", Fraction(0), Fraction(0), Fraction(0))
            e_used, d_used = m.approx_usage(ep, rr, dd)
            assert m.cap_eps is not None and m.cap_delta is not None
            assert e_used <= dec(m.cap_eps), f"(ε, δ) OVERSPEND: ε used {e_used} > {m.cap_eps}"
            assert d_used <= m.cap_delta, f"(ε, δ) OVERSPEND: δ used {d_used} > {m.cap_delta}"

    @precondition(lambda self: bool(self.ds))
    @rule(which=st.integers(0, 100), who=st.integers(0, 1),
          eps0=st.sampled_from(["0.5", "0.25", "1", "0.3", "0.000000000001", "0.0000000000005",
                                "2"]),
          subjects=st.lists(st.sampled_from(["s0", "s1", "s2", "s3", "007", "7"]), min_size=1,
                            max_size=6),
          central=st.sampled_from([None, "pure", "zcdp", "approx", "per_subject"]),
          keyed=st.sampled_from(["none", "new", "replay", "replay_other"]),
          as_cost=st.booleans())
    @_step
    def charge_subjects(self, which: int, who: int, eps0: str, subjects: list[str],
                        central: str | None, keyed: str, as_cost: bool) -> None:
        m = self._pick(which)
        acct = self._acct(who)
        sub_keys = [k for k, u in m.keys.items() if u.kind == "subjects"]
        if keyed == "replay_other" and sub_keys:
            # the same key with the subjects in another order, or one more: another request
            key = sub_keys[-1]
            e0, subs, cc = m.keys[key].request
            other = list(reversed(subs)) if list(reversed(subs)) != list(subs) else [
                *subs, "s9"]
            before = self._snap()
            with pytest.raises(InvalidInput, match="idempotency key"):
                acct.charge_subjects(m.name, e0, other, central_cost=cc, idempotency_key=key)
            self._unchanged(before, "a reused batch key with other subjects")
            return
        if keyed == "replay" and sub_keys:
            key = sub_keys[0]
            use = m.keys[key]
            e0, subs, cc = use.request
            before = self._snap()
            res = acct.charge_subjects(m.name, e0, list(subs), central_cost=cc,
                                       idempotency_key=key)
            assert res.replayed and res.charge_id == use.charge_id
            event("subjects: replayed")
            assert res.accepted == use.receipt.accepted
            assert res.accepted_mask is not None
            assert list(res.accepted_mask) == list(use.receipt.accepted_mask)
            if use.receipt.central is not None:  # the batch's own central charge, replayed
                assert res.central is not None, res
                assert res.central.charge_id == use.receipt.central.charge_id
                assert res.central.cost == use.receipt.central.cost
            else:
                assert res.central is None, res
            self._unchanged(before, "a replayed subject batch")
            return
        key = self._new_key() if keyed != "none" else None
        cc: Any = None
        ckind, ce, cr, cd = "pure", Fraction(0), Fraction(0), Fraction(0)
        if central == "pure":
            cc, ce = PureDP("0.01"), Fraction(1, 100)
        elif central == "zcdp":
            ckind, cc, cr = "zcdp", ZCDP("0.001"), Fraction(1, 1000)
        elif central == "approx":
            ckind, cc, ce, cd = "approx", ApproxDP("0.01", "0"), Fraction(1, 100), Fraction(0)
        elif central == "per_subject":  # a function of who was accepted: 0.001 per subject
            def cc(mask: np.ndarray) -> PureDP | None:
                return PureDP(f"0.{int(mask.sum()):03d}") if mask.any() else None
        e = up12(frac(eps0))
        before = self._snap()
        if frac(eps0) != e and not as_cost:  # an amount is refused with > 12 places
            with pytest.raises(InvalidInput, match="decimal places"):
                acct.charge_subjects(m.name, eps0, subjects, idempotency_key=key)
            self._unchanged(before, "an ε0 with more than 12 places")
            return
        # the model: each subject with room under its cap is charged once, for one of its rows
        # (which one is chosen at random: compared per subject below)
        room = {s for s in subjects if m.subject_cap is not None
                and m.subjects.get(s, Fraction(0)) + e <= m.subject_cap}
        accepted = [s in room for s in dict.fromkeys(subjects)]  # one per distinct subject
        if central == "per_subject":
            ce = Fraction(sum(accepted), 1000)
            if not ce:
                cc = None  # the function gives no central cost: none is charged
        central_ok = True
        if cc is not None:
            v = m.fits(ckind, ce, cr, cd)
            if v is None:
                verdict = m.approx_verdict(ckind, ce, cr, cd)
                central_ok = verdict != "over"
                if verdict == "edge":  # do not bet on the rounding: skip the edge
                    return
            else:
                central_ok = v
        expect_ok = m.subject_cap is not None and any(accepted) and central_ok
        try:
            res = acct.charge_subjects(m.name, LocalDP(eps0) if as_cost else eps0, subjects,
                                       central_cost=cc, idempotency_key=key)
        except BudgetRefused:
            event("subjects: refused")
            assert not expect_ok, (f"refused a subject batch the model accepts: {eps0} "
                                   f"{subjects} central={central} on {m}")
            self._unchanged(before, "a refused subject batch")
            return
        event(f"subjects: accepted {sum(accepted)}/{len(subjects)}, central={central}")
        assert expect_ok, f"accepted a subject batch the model refuses: {eps0} {subjects} {m}"
        assert res.accepted_mask is not None
        rows = {s: sum(bool(ok) for t, ok in zip(subjects, res.accepted_mask, strict=True)
                       if t == s) for s in subjects}
        assert rows == {s: int(s in room) for s in subjects}, (rows, room)
        assert res.accepted == sum(accepted)
        self._charged(m, res.charge_id)
        for s in room:
            m.subjects[s] = m.subjects.get(s, Fraction(0)) + e
        if cc is not None:
            assert res.central is not None
            self._charged(m, res.central.charge_id, (ckind, ce, cr, cd))
        if key is not None:
            m.keys[key] = KeyUse("subjects", (dec(e), tuple(subjects), cc),
                                 charge_id=res.charge_id, receipt=res)
        for s in set(subjects):
            assert frac(acct.subject_spend(m.name, s)) == m.subjects.get(s, Fraction(0))

    @precondition(lambda self: bool(self.ds))
    @rule(which=st.integers(0, 100), who=st.integers(0, 1),
          method=st.sampled_from(["split", "pcoqs", "exponq"]),
          amount=st.sampled_from([0.05, 0.1, 0.5, 1e-12, 0.3]),
          alpha=st.sampled_from([0.1, 0.2]), keyed=st.sampled_from(["none", "new", "replay",
                                                                      "other"]),
          data_seed=st.integers(0, 3))
    @_step
    def calibrate(self, which: int, who: int, method: str, amount: float, alpha: float,
                  keyed: str, data_seed: int) -> None:
        m = self._pick(which)
        acct = self._acct(who)
        keys = m.release_keys if method == "split" else m.keys
        cal_keys = [k for k, u in keys.items() if u.kind == "calibrate"
                    and u.request[0] == method]
        if keyed in ("replay", "other") and cal_keys:
            key = cal_keys[0]
            use = keys[key]
            _, a, al, sd = use.request
            if keyed == "other":
                al = 0.15
            before = self._snap()
            kw = {} if method == "split" else {"rho" if method == "pcoqs" else "epsilon": a}
            if keyed == "other":
                with pytest.raises(InvalidInput, match="idempotency key"):
                    acct.calibrate(method, dataset=m.name, scores=_scores(sd), alpha=al,
                                   idempotency_key=key, rng=Seeded(sd), **kw)
                self._unchanged(before, "a calibration under a reused key")
                return
            rel = acct.calibrate(method, dataset=m.name, scores=_scores(sd), alpha=al,
                                 idempotency_key=key, rng=Seeded(sd), **kw)
            event(f"calibrate: replayed {method}")
            assert rel.id == use.release_id
            assert rel == use.receipt, "a replayed calibration returned another release"
            self._unchanged(before, "a replayed calibration")
            return
        key = self._new_key() if keyed != "none" else None
        kw = {}
        kind, ce, cr = "pure", Fraction(0), Fraction(0)
        if method == "pcoqs":
            kw = {"rho": amount}
            kind, cr = "zcdp", up12(given_value(amount))
        elif method == "exponq":
            kw = {"epsilon": amount}
            ce = up12(given_value(amount))
        if method == "split":
            expect: bool | str | None = m.nonprivate
        else:
            expect = m.fits(kind, ce, cr, Fraction(0))
            if expect is None:
                expect = m.approx_verdict(kind, ce, cr, Fraction(0))
        before = self._snap()
        # the dry run (by the other accountant) writes nothing and agrees with the run
        dry = price(self._acct(who + 1), method, {"alpha": alpha, **kw}, dataset=m.name,
                    scores=_scores(data_seed))
        self._unchanged(before, "a dry run")
        if expect in (True, "fits", False, "over"):
            assert dry.allowed == (expect in (True, "fits")), (dry, expect)
        if dry.allowed and m.notion != "approx" and method != "split":
            unit = "epsilon" if m.notion == "pure" else "rho"
            left = m.remaining_exact()
            assert left is not None and dry.remaining_after is not None
            spent = ce if m.notion == "pure" else (cr if kind == "zcdp" else ce * ce / 2)
            assert frac(dry.remaining_after[unit]) == left - spent, (dry, left, spent)
        try:
            rel = acct.calibrate(method, dataset=m.name, scores=_scores(data_seed), alpha=alpha,
                                 idempotency_key=key, rng=Seeded(data_seed), **kw)
        except BudgetRefused:
            event(f"calibrate: refused {method} on {m.notion}")
            assert expect in (False, "over", "edge"), f"refused {method} {kw} on {m}"
            assert not dry.allowed, f"the dry run allowed {method} {kw}, the run refused it"
            self._unchanged(before, f"a refused {method}")
            return
        assert dry.allowed, f"the dry run refused {method} {kw}, the run accepted it: {dry}"
        event(f"calibrate: accepted {method} on {m.notion}")
        assert expect in (True, "fits", "edge"), f"OVERSPEND: accepted {method} {kw} on {m}"
        self.entries += 1
        self.releases_total += 1
        m.releases += 1
        assert rel.id not in self.seen_release_ids
        self.seen_release_ids.add(rel.id)
        if method != "split":
            self._charged(m, None, (kind, ce, cr, Fraction(0)))
        if key is not None:
            keys[key] = KeyUse("calibrate", (method, amount, alpha, data_seed),
                               release_id=rel.id, receipt=rel)
        # the saved release loads back as itself, and the ledger's record is the same
        assert Release.load(rel.model_dump_json()) == rel
        assert self._acct(who + 1).release(rel.id) == rel

    @precondition(lambda self: bool(self.ds))
    @rule(which=st.integers(0, 100), who=st.integers(0, 1), bad=st.sampled_from(BAD_AMOUNTS),
          op=st.sampled_from(["pure", "zcdp", "approx_eps", "approx_delta", "eps0",
                              "construct", "construct_zcdp", "unknown", "notacost", "local",
                              "create", "reserved_key", "cal_unknown", "cal_bad"]))
    @_step
    def refused(self, which: int, who: int, bad: Any, op: str) -> None:
        m = self._pick(which)
        acct = self._acct(who)
        before = self._snap()
        with pytest.raises((PrivcalError, ValueError, TypeError)):
            if op == "pure":
                acct.charge(m.name, PureDP(bad))
            elif op == "zcdp":
                acct.charge(m.name, ZCDP(bad))
            elif op == "approx_eps":
                acct.charge(m.name, ApproxDP(bad if bad != 0 else -1, 0))
            elif op == "approx_delta":
                acct.charge(m.name, ApproxDP(0, bad if bad != 0 else 1))
            elif op == "eps0":
                acct.charge_subjects(m.name, bad, ["s0"])
            elif op == "construct":  # a cost built without its validators
                v = [Decimal("-1"), Decimal(0), Decimal("-0"), Decimal("NaN"),
                     Decimal("Infinity"), Decimal("1e999"), Decimal("-1e-13")][which % 7]
                acct.charge(m.name, PureDP.model_construct(eps=v))
            elif op == "construct_zcdp":
                acct.charge(m.name, ZCDP.model_construct(rho=bad))
            elif op == "unknown":
                acct.charge("no-such-dataset", PureDP("0.1"))
            elif op == "notacost":
                acct.charge(m.name, 0.1)  # type: ignore[arg-type]
            elif op == "local":
                acct.charge(m.name, LocalDP("0.1"))  # type: ignore[arg-type]
            elif op == "create":
                acct.create_dataset(f"bad-{next(self._names)}", epsilon=bad if bad != 0 else
                                    "0.0000000000001")
            elif op == "reserved_key":
                acct.charge(m.name, PureDP("0.000000000001"), idempotency_key="x#central")
            elif op == "cal_unknown":
                acct.calibrate("no-such-method", dataset=m.name, scores=_scores(0), alpha=0.1)
            else:
                acct.calibrate("exponq", dataset=m.name, scores=_scores(0), alpha=0.1,
                               epsilon=bad if bad != 0 else -1, rng=Seeded(0))
        self._unchanged(before, f"a refused operation ({op}, {bad!r})")

    @precondition(lambda self: bool(self.ds))
    @rule(who=st.integers(0, 1))
    @_step
    def unknown_dataset(self, who: int) -> None:
        before = self._snap()
        with pytest.raises(NotFound):
            self._acct(who).budget("no-such-dataset")
        with pytest.raises(NotFound):
            self._acct(who).charge("no-such-dataset", ZCDP("0.01"), idempotency_key="z")
        self._unchanged(before, "a charge of an unknown dataset")

    @precondition(lambda self: bool(self.ds))
    @rule(which=st.integers(0, 100), n=st.integers(1, 4),
          amounts=st.lists(st.tuples(
              st.sampled_from(["pure", "zcdp", "approx"]),
              st.sampled_from(["0.1", "0.05", "0.000000000001", "0.3", "0.25"])),
              min_size=8, max_size=8),
          same_key=st.booleans())
    @_step
    def concurrent_charges(self, which: int, n: int, amounts: list[tuple[str, str]],
                           same_key: bool) -> None:
        """Both accountants charge one dataset at once, from two threads (two processes'
        worth of connections and snapshots). Totals only grow, so at the end the totals fit
        the cap and every refused cost would not fit even the final totals; one key used by
        both threads at once is charged once, the other call replays it."""
        import threading

        m = self._pick(which)
        allowed = {"pure": ["pure"], "zcdp": ["pure", "zcdp"],
                   "approx": ["pure", "zcdp", "approx"]}[m.notion]
        ops: list[tuple[str, Fraction, Fraction, Fraction]] = []
        for kind, amount in amounts:
            kind = kind if kind in allowed else m.notion
            a = frac(amount)
            if kind == "zcdp":
                a = up12(a / 10)  # ρ is costlier under an (ε, δ) cap
            ops.append((kind, a if kind != "zcdp" else Fraction(0),
                        a if kind == "zcdp" else Fraction(0),
                        Fraction(1, 10 ** 9) if kind == "approx" else Fraction(0)))
        shared = self._new_key() if same_key else None
        if shared is not None:
            ops[0] = ops[4] = (m.notion if m.notion != "approx" else "pure", ONE_Q,
                               ONE_Q if m.notion == "zcdp" else Fraction(0), Fraction(0))
            if m.notion == "zcdp":
                ops[0] = ops[4] = ("zcdp", Fraction(0), ONE_Q, Fraction(0))
        out: list[list[tuple[int, Any]]] = [[], []]
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def work(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                for j in range(n):
                    kind, e, r, d = ops[i * 4 + j]
                    key = shared if j == 0 else None
                    try:
                        out[i].append((i * 4 + j, self.accts[i].charge(
                            m.name, _cost(kind, e, r, d), idempotency_key=key)))
                    except BudgetRefused:
                        out[i].append((i * 4 + j, None))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        event(f"concurrent ({m.notion}): {sum(r is None for o in out for _, r in o)} refused")
        recorded: dict[int, int] = {}
        refused: list[int] = []
        for i in range(2):
            for op, rec in out[i]:
                if rec is None:
                    refused.append(op)
                elif rec.replayed:
                    assert shared is not None and rec.idempotency_key == shared
                else:
                    assert rec.charge_id not in recorded
                    recorded[rec.charge_id] = op
        if shared is not None:
            firsts = [out[i][0][1] for i in range(2)]
            if all(r is not None for r in firsts):
                assert firsts[0].charge_id == firsts[1].charge_id, firsts  # type: ignore[union-attr]
                assert sorted(bool(r.replayed) for r in firsts) == [False, True]  # type: ignore[union-attr]
        for cid, op in recorded.items():
            self._charged(m, cid, ops[op])
            if shared is not None and op in (0, 4):
                kind, e, r, d = ops[op]
                rec0 = out[op // 4][0][1]
                m.keys[shared] = KeyUse("charge", (kind, (e, r, d), None),
                                        charge_id=cid, receipt=rec0)
        if m.notion == "approx":
            assert m.cap_eps is not None and m.cap_delta is not None
            e_used, d_used = m.approx_usage(*m.after("pure", Fraction(0), Fraction(0),
                                                     Fraction(0)))
            assert e_used <= dec(m.cap_eps) and d_used <= m.cap_delta, (
                f"OVERSPEND under concurrency on {m.name}: ({e_used}, {d_used})")
            for op in refused:
                assert m.approx_verdict(*ops[op]) != "fits", (
                    f"refused {ops[op]} under concurrency although even the final totals "
                    f"leave room on {m.name}")
            return
        used = m.pure_eps if m.notion == "pure" else m.pure_rho + m.zcdp_rho
        cap = m.cap_eps if m.notion == "pure" else m.cap_rho
        assert cap is not None
        assert used <= cap, f"OVERSPEND under concurrency: {used} > {cap} on {m.name}"
        for op in refused:
            assert not m.fits(*ops[op]), (
                f"refused {ops[op]} under concurrency although even the final total {used} "
                f"leaves room under {cap}")

    @precondition(lambda self: any(m.notion == "zcdp" for m in self.ds.values()))
    @rule(which=st.integers(0, 100), rho=st.sampled_from([0.01, 0.05, 0.5]))
    @_step
    def concurrent_calibrations(self, which: int, rho: float) -> None:
        """Both accountants run one keyed P-COQS calibration at once (a client retrying on
        another process): one charge, one release, the same release returned to both, or
        both refused writing nothing."""
        import threading

        ms = [m for m in self.ds.values() if m.notion == "zcdp"]
        m = ms[which % len(ms)]
        key = self._new_key()
        res: list[Any] = [None, None]
        barrier = threading.Barrier(2)

        def work(i: int) -> None:
            try:
                barrier.wait(timeout=30)
                res[i] = self.accts[i].calibrate("pcoqs", dataset=m.name, scores=_scores(1),
                                                 alpha=0.1, rho=rho, idempotency_key=key,
                                                 rng=Seeded(i))
            except BaseException as exc:  # reported below
                res[i] = exc

        before = self._snap()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        c = up12(given_value(rho))
        fits = m.fits("zcdp", Fraction(0), c, Fraction(0))
        if not fits:
            assert all(isinstance(r, BudgetRefused) for r in res), res
            self._unchanged(before, "a refused concurrent calibration")
            event("concurrent calibrate: refused")
            return
        assert all(isinstance(r, Release) for r in res), res
        assert res[0].id == res[1].id and res[0] == res[1], res
        event("concurrent calibrate: one release")
        self.seen_release_ids.add(res[0].id)
        self._charged(m, None, ("zcdp", Fraction(0), c, Fraction(0)))
        m.releases += 1
        self.entries += 1
        self.releases_total += 1
        m.keys[key] = KeyUse("calibrate", ("pcoqs", rho, 0.1, 1), release_id=res[0].id,
                             receipt=res[0])

    @precondition(lambda self: any(m.notion != "approx" for m in self.ds.values()))
    @rule(which=st.integers(0, 100), first=st.integers(0, 1), pure=st.booleans())
    @_step
    def stale_view_at_the_edge(self, which: int, first: int, pure: bool) -> None:
        """Accountant A charges a dataset (on PostgreSQL it now keeps that row as its
        snapshot), B charges it (A's snapshot is stale), then A asks for one quantum more
        than is left (refused) and then exactly what is left (accepted): the cap is checked
        against the totals as committed, not as A last saw them."""
        ms = [m for m in self.ds.values() if m.notion != "approx"]
        m = ms[which % len(ms)]
        kind = "pure" if m.notion == "pure" or pure else "zcdp"
        a, b = self.accts[first], self.accts[1 - first]
        for acct in (a, b):
            c = (ONE_Q, Fraction(0)) if kind == "pure" else (Fraction(0), ONE_Q)
            if m.fits(kind, c[0], c[1], Fraction(0)):
                rec = acct.charge(m.name, _cost(kind, c[0], c[1], Fraction(0)))
                self._charged(m, rec.charge_id, (kind, c[0], c[1], Fraction(0)))
        left = m.remaining_exact()
        assert left is not None
        if kind == "pure" and m.notion == "zcdp":  # ε²/2 ≤ left: the largest 12-place ε
            root = Fraction(math.isqrt(int(2 * left * Q * Q)), Q)
            exact, over = root, root + ONE_Q
        else:  # what is left on the 12-place grid (a zCDP cap charged ε²/2 has finer totals)
            exact = Fraction(math.floor(left * Q), Q)
            over = exact + ONE_Q
        c_over = (over, Fraction(0)) if kind == "pure" else (Fraction(0), over)
        before = self._snap()
        with pytest.raises(BudgetRefused):
            a.charge(m.name, _cost(kind, *c_over, Fraction(0)))
        self._unchanged(before, "one quantum past the cap, from a stale view")
        if exact > 0:
            c = (exact, Fraction(0)) if kind == "pure" else (Fraction(0), exact)
            assert m.fits(kind, c[0], c[1], Fraction(0))
            rec = a.charge(m.name, _cost(kind, c[0], c[1], Fraction(0)))
            self._charged(m, rec.charge_id, (kind, c[0], c[1], Fraction(0)))
            event("stale view: filled to the cap")

    @precondition(lambda self: any(m.subject_cap for m in self.ds.values()))
    @rule(which=st.integers(0, 100), first=st.integers(0, 1))
    @_step
    def subject_at_the_edge(self, which: int, first: int) -> None:
        """A fresh subject is charged its cap less one quantum by A, the last quantum by B
        (accepted: exactly at the cap), then one more quantum by A (refused, nothing
        written): the per-subject cap is exact, whichever process charges."""
        ms = [m for m in self.ds.values() if m.subject_cap]
        m = ms[which % len(ms)]
        assert m.subject_cap is not None
        sid = f"edge-{next(self.key_counter)}"
        a, b = self.accts[first], self.accts[1 - first]
        for acct, e0 in ((a, m.subject_cap - ONE_Q), (b, ONE_Q)):
            res = acct.charge_subjects(m.name, _as_form(e0, "str"), [sid])
            assert res.accepted == 1, res
            self._charged(m, res.charge_id)
            m.subjects[sid] = m.subjects.get(sid, Fraction(0)) + e0
        assert frac(b.subject_spend(m.name, sid)) == m.subject_cap
        before = self._snap()
        with pytest.raises(BudgetRefused):
            a.charge_subjects(m.name, "0.000000000001", [sid])
        self._unchanged(before, "one quantum past a subject's cap")
        event("subject filled to its cap")

    @precondition(lambda self: not self.hostile)
    @rule(prec=st.integers(1, 6), rounding=st.sampled_from(
        ["ROUND_FLOOR", "ROUND_CEILING", "ROUND_DOWN", "ROUND_HALF_UP"]), emin=st.booleans())
    @_step
    def hostile_decimal_context(self, prec: int, rounding: str, emin: bool) -> None:
        """The calling program's decimal context (this thread's, and the default new threads
        copy) is changed: privcal's amounts must not depend on it (the model's are exact)."""
        import decimal

        for ctx in (decimal.getcontext(), decimal.DefaultContext):
            ctx.prec, ctx.rounding = prec, getattr(decimal, rounding)
            if emin:
                ctx.Emin, ctx.Emax = -9, 9
        self.hostile = True
        event("hostile decimal context")

    @rule(who=st.integers(0, 1))
    @_step
    def reopen(self, who: int) -> None:
        """A process restarts: its Accountant (and its cached snapshots) is replaced."""
        self.accts[who].close()
        self.accts[who] = Accountant(Ledger(self.URL))

    # ------------------------------------------------------------ invariants
    @invariant()
    @_step
    def budgets_match_model(self) -> None:
        if not self.accts:
            return
        self.steps += 1
        for n, m in self.ds.items():
            b = self.accts[self.steps % 2].budget(n)
            assert b.charges == m.charges, (n, b.charges, m.charges)
            assert b.releases == m.releases, (n, b.releases, m.releases)
            sub = m.subject_cap or Fraction(0)
            if m.subject_cap is not None and self.steps % 3 == 0:
                summ = self.accts[self.steps % 2].subject_summary(n)
                spends = [v for v in m.subjects.values() if v > 0]
                assert summ.subjects == len(spends), (n, summ, m.subjects)
                assert frac(summ.max) == max(spends, default=Fraction(0)), (n, summ)
                assert summ.at_cap == sum(v >= m.subject_cap for v in spends), (n, summ)
                assert frac(b.spent_dp.subject_max or 0) == max(spends, default=Fraction(0))
            if m.notion == "pure":
                assert frac(b.spent["epsilon"]) == m.pure_eps, (n, b.spent, m.pure_eps)
                assert m.pure_eps <= (m.cap_eps or 0), f"OVERSPEND on {n}"
                assert frac(b.remaining["epsilon"]) == m.remaining_exact()
                assert (frac(b.guarantee.epsilon), b.guarantee.delta) == (
                    (m.cap_eps or 0) + sub, 0)
            elif m.notion == "zcdp":
                used = m.pure_rho + m.zcdp_rho
                assert frac(b.spent["rho"]) == used, (n, b.spent, used)
                assert used <= (m.cap_rho or 0), f"OVERSPEND on {n}"
                assert frac(b.remaining["rho"]) == m.remaining_exact()
            else:
                assert m.cap_eps is not None and m.cap_delta is not None
                ep, r, d = m.after("pure", Fraction(0), Fraction(0), Fraction(0))
                e_used, d_used = m.approx_usage(ep, r, d)
                assert frac(b.spent["delta"]) == d_used, (n, b.spent, d_used)
                got = b.spent["epsilon"]
                assert got >= e_used, f"{n}: reported ε spent {got} below the exact {e_used}"
                assert d_used <= m.cap_delta and e_used <= dec(m.cap_eps), f"OVERSPEND on {n}"
                assert frac(b.spent["epsilon"]) <= m.cap_eps
                # what is reported left is never more than is exactly left
                with localcontext(_CTX):
                    left = max(Decimal(0), dec(m.cap_eps) - e_used)
                assert b.remaining["epsilon"] <= left, (n, b.remaining, e_used)
                assert frac(b.remaining["delta"]) == max(Fraction(0), m.cap_delta - d_used)
                assert (frac(b.guarantee.epsilon), frac(b.guarantee.delta)) == (
                    m.cap_eps + sub, m.cap_delta), (n, b.guarantee)
        if self.steps % _VERIFY_EVERY == 0:
            self._verify()

    @invariant()
    @_step
    def head_matches(self) -> None:
        if self.accts:
            assert self.accts[self.steps % 2].ledger.head().seq == self.entries


def _cost(kind: str, eps: Fraction, rho: Fraction, delta: Fraction, *, form: str = "str",
          raw: Any = None) -> PureDP | ZCDP | ApproxDP:
    if kind == "pure":
        return PureDP(raw if raw is not None and raw != 0 else _as_form(eps, form))
    if kind == "zcdp":
        return ZCDP(_as_form(rho, form))
    e = raw if raw is not None and raw != 0 else (_as_form(eps, form) if eps else 0)
    return ApproxDP(e, _as_form(delta, "str") if delta else 0)


_DECIMAL_DEFAULTS = (28, "ROUND_HALF_EVEN", -999999, 999999)


def _restore_decimal() -> None:
    import decimal

    for ctx in (decimal.getcontext(), decimal.DefaultContext):
        ctx.prec, ctx.Emin, ctx.Emax = _DECIMAL_DEFAULTS[0], *_DECIMAL_DEFAULTS[2:]
        ctx.rounding = getattr(decimal, _DECIMAL_DEFAULTS[1])


def _charged(cost: PureDP | ZCDP | ApproxDP) -> tuple[Fraction, Fraction, Fraction]:
    """(ε, ρ, δ) a central cost is charged: what it holds, rounded up to 12 places."""
    f = vars(cost)
    return (up12(given_value(f["eps"])) if "eps" in f else Fraction(0),
            up12(given_value(f["rho"])) if "rho" in f else Fraction(0),
            up12(given_value(f["delta"])) if "delta" in f else Fraction(0))


def _scores(data_seed: int) -> np.ndarray:
    return np.random.default_rng(data_seed).random(20)


def _run(url: str) -> None:
    from privcal.storage import Ledger as _Ledger

    with _Ledger(url) as led:
        led.upgrade()

    class Machine(LedgerMachine):
        URL = url

    conf = settings(max_examples=_EXAMPLES, stateful_step_count=_STEPS, deadline=None,
                    derandomize=_SEED is None, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck),
                    # shrinking a ledger run takes minutes: the failing steps are printed as
                    # found (PRIVCAL_STATEFUL_SHRINK=1 to shrink them)
                    phases=[Phase.explicit, Phase.reuse, Phase.generate,
                            *([Phase.shrink] if _SHRINK else [])])
    if _SEED is not None:
        seed(int(_SEED))(Machine)
    STATS.clear()
    run_state_machine_as_test(Machine, settings=conf)
    if os.environ.get("PRIVCAL_STATEFUL_STATS"):
        for what, n in sorted(STATS.items()):
            print(f"{n:6d}  {what}")


def test_ledger_state_machine(ledger_url: str) -> None:
    """The model-based exploration, on SQLite and (with $PRIVCAL_TEST_DATABASE_URL)
    PostgreSQL."""
    _run(ledger_url)
