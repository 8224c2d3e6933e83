"""Red team 8 (lead's fixes and the reviews of the fixes): a session option given under both
of its names is refused, not one silently dropped (H-F3); a dataset name with a
bidirectional control (it prints as another name) is refused (H-F9); the SQLite key lock by
the file's real path (K); session ids past 2³¹−1; the ties note for several levels; decimal
contexts of the exact sampler and of a bound's text that depend on nothing global (R2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.accountant import sessions as S
from privcal.errors import InvalidInput
from tests.test_red_team_7 import FED2, LDP, _state


@pytest.mark.parametrize(("method", "base", "both", "message"), [
    ("ldp-score", LDP, {"delta": 0.5, "failure_probability": 0.001},
     "give failure_probability or its deprecated spelling delta, not both"),
    ("fedcp2-qq", FED2, {"upper": 2.0, "smax": 1.0},
     "give upper or its deprecated spelling smax, not both"),
])
def test_an_option_under_both_its_names_is_refused(accountant: Any, method: str,
                                                   base: dict[str, Any], both: dict[str, Any],
                                                   message: str) -> None:
    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    before = _state(acct)
    with pytest.raises(InvalidInput, match=message):
        S.open_session(acct, method, dataset="d", **base, **both)
    assert _state(acct) == before
    # each name alone still opens, with the value given
    old, new = sorted(both, key=lambda k: k in ("failure_probability", "upper"))
    opened = S.open_session(acct, method, dataset="d", **base, **{old: both[old]})
    key = "failure_probability" if new == "failure_probability" else "upper"
    assert opened.params[key] == both[old]


@pytest.mark.parametrize("name", ["a\u202eb", "\u202eadmin", "x\u200f", "\u2066y\u2069",
                                  "z\u061c"])
def test_a_dataset_name_with_a_bidi_control_is_refused(accountant: Any, name: str) -> None:
    acct: Accountant = accountant
    head = acct.ledger.head()
    with pytest.raises(InvalidInput, match="bidirectional control U\\+"):
        acct.create_dataset(name, epsilon=1)
    assert acct.ledger.head() == head and acct.datasets() == []


def test_a_right_to_left_name_without_controls_is_a_name(accountant: Any) -> None:
    acct: Accountant = accountant
    acct.create_dataset("מחקר-1", epsilon=1)
    assert [d.name for d in acct.datasets()] == ["מחקר-1"]


def test_a_symlinked_sqlite_ledger_takes_the_same_key_locks(tmp_path: Any) -> None:
    """Red team 8 (K): the SQLite key lock (a keyed run's exactly-once) was keyed by the
    path as written: the same file through a symlink took other locks (a lock file of its
    own, and another in-process lock), so two keyed runs could proceed at once."""
    import threading

    from privcal.storage import Ledger

    real = tmp_path / "real" / "l.db"
    real.parent.mkdir()
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / "l.db"
    first = Ledger(f"sqlite:///{real}")
    first.upgrade()
    link.symlink_to(real)
    second = Ledger(f"sqlite:///{link}")
    order: list[str] = []
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with first.key_lock("d", "k"):
            order.append("first in")
            held.set()
            release.wait(10)
            order.append("first out")

    def take() -> None:
        held.wait(10)
        with second.key_lock("d", "k"):
            order.append("second in")

    threads = [threading.Thread(target=hold), threading.Thread(target=take)]
    for t in threads:
        t.start()
    held.wait(10)
    threads[1].join(0.5)  # it must be waiting for the first's lock
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]
    assert (real.parent / "l.db.keylocks").exists()
    assert not (link.parent / "l.db.keylocks").exists()
    first.close()
    second.close()


@pytest.mark.parametrize("sid", [2**31, 2**40, 2**63 - 1])
def test_a_session_id_past_the_stored_range_is_unknown_everywhere(accountant: Any,
                                                                  sid: int) -> None:
    """Red team 8 (H-F2, and the fixer's note): a session id past 2³¹−1 reached
    PostgreSQL's 32-bit id column on close and ingest (an error, not "unknown session");
    every session entry point now says NotFound, on every backend, writing nothing."""
    from privcal.errors import NotFound

    acct: Accountant = accountant
    acct.create_dataset("d", epsilon=1, subject_epsilon=5)
    head = acct.ledger.head()
    for call in (lambda: S.session_status(acct, sid),
                 lambda: S.close_session(acct, sid),
                 lambda: S.submit_reports(acct, sid, ["a"], [1], [0])):
        with pytest.raises(NotFound, match=f"unknown session {sid}"):
            call()
    assert acct.ledger.head() == head


def test_several_levels_of_split_say_when_ties_void_the_headline_upper_bound(
        ledger: Any, tmp_path: Any) -> None:
    """The ties note (red team 7) read the release's top-level diagnostics only: a
    ``levels:split`` release records its levels' diagnostics under ``levels`` and its
    headline upper bound is the first level's, so tied scores there went unmentioned."""
    import numpy as np
    from click.testing import CliRunner

    from privcal.cli import main

    url = str(ledger.engine.url.render_as_string(hide_password=False))
    Accountant(ledger).create_dataset("t", epsilon=1, allow_nonprivate=True)
    tied = np.array([0.0, 0.5, 1.0, 0.5] * 5)
    free = np.random.default_rng(0).random(20)
    for scores, ties in ((tied, True), (free, False)):
        path = tmp_path / f"s{ties}.npy"
        np.save(path, scores)
        res = CliRunner().invoke(main, ["--db-url", url, "calibrate", "split",
                                        "--dataset", "t", "--alpha", "0.1,0.2",
                                        "--scores", str(path)])
        assert res.exit_code == 0, res.output
        assert ("other calibration scores equal the threshold: the upper bound 0.947619 "
                "(no ties) does not apply" in res.stdout) == ties, res.stdout


@pytest.fixture
def changed_default_context() -> Any:
    """``decimal.DefaultContext`` as an embedding program may set it (Emin -99, Inexact
    trapped), restored after the test."""
    import decimal

    saved = decimal.DefaultContext.copy()
    decimal.DefaultContext.Emin = -99
    decimal.DefaultContext.traps[decimal.Inexact] = True
    try:
        yield
    finally:
        for field in ("prec", "rounding", "Emin", "Emax", "capitals", "clamp"):
            setattr(decimal.DefaultContext, field, getattr(saved, field))
        decimal.DefaultContext.traps = dict(saved.traps)
        decimal.DefaultContext.flags = dict(saved.flags)


def test_exact_sampler_bounds_ignore_the_default_context(changed_default_context: Any) -> None:
    """Review R2 (F3): the exact exponential sampler built its decimal contexts from
    ``decimal.DefaultContext`` (the fields a ``Context(...)`` call omits): with Emin -99
    the bounds of exp(−300) were both 0 — a grid point's probability 0 on one dataset and
    positive on a neighbour — and with Inexact trapped every draw raised."""
    import random
    from decimal import Context, Decimal
    from fractions import Fraction

    from privcal.calibrators.mechanisms import exponential as em

    ref = Fraction(Context(prec=60, Emin=-10**6, Emax=10**6, traps=[]).exp(Decimal(-300)))
    lo, hi = em._exp_bounds(Fraction(300), 30)
    assert 0 < lo <= ref <= hi and (hi - lo) / ref < Fraction(1, 10**25)
    below = np.arange(0, 110, 10)  # 11 grid points of 100 scores: counts below, above
    index = em.sample_index(below, 100 - below, 0.5, 1.0, random.Random(3))
    assert 0 <= index <= 10  # Inexact trapped in DefaultContext: no longer raised


def test_a_bound_s_text_ignores_the_caller_s_precision() -> None:
    """Review R2 (F3): ``text_at_most`` normalised its decimal in the caller's context: under
    ``localcontext(prec=3)`` P-COQS's 57/70 printed as 0.814, not 0.814285 — a statement
    that no longer recomputes to the recorded one."""
    from decimal import localcontext
    from fractions import Fraction

    from privcal.calibrators.bound_floats import text_at_least, text_at_most

    x = float(Fraction(57, 70))
    with localcontext() as ctx:
        ctx.prec = 3
        assert text_at_most(x, Fraction(57, 70)) == "0.814285"
        assert text_at_least(float(Fraction(1, 3)) - 1e-12, Fraction(1, 3)) == "0.333334"


def test_the_exact_sampler_returns_at_huge_exponents() -> None:
    """Review R2 (F4): the sampler shifted the exponents by v_min·(1 − 2⁻³⁰), leaving the
    best grid point v_min·2⁻³⁰: past ε·n ≈ 10¹¹ every proposal was accepted with a
    vanishing probability and an ExponQ calibration never returned (after its charge). The
    shift is the exact minimum now; run in a subprocess, so the old hang fails, not stalls."""
    import subprocess
    import sys

    code = ("import random, numpy as np\n"
            "from privcal.calibrators.mechanisms.exponential import sample_index\n"
            "b = np.arange(1001); a = 1000 - b\n"
            "print([sample_index(b, a, 0.5, e, random.Random(0)) for e in (1e9, 1e12, 1e15)])\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("sample_index did not return in 60 s at ε·n = 10¹²")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[500, 500, 500]"  # the median: every other point ~e^-10⁵


def test_the_accountant_ignores_a_default_context_set_before_import(tmp_path: Any) -> None:
    """Review R3 (F1): the accountant's module-level exact contexts (filters, guarantees,
    report, the subject units) were ``Context(prec=…)``, built at import from
    ``decimal.DefaultContext``: a program that trapped Inexact before importing privcal had
    every zCDP charge to an (ε, δ) cap raise a bare ``decimal.Inexact``. Run in a fresh
    interpreter, the context changed first."""
    import subprocess
    import sys

    code = (
        "import decimal\n"
        "decimal.DefaultContext.traps[decimal.Inexact] = True\n"
        "decimal.DefaultContext.Emin = -99\n"
        "from privcal.accountant import Accountant\n"
        "from privcal.costs import ZCDP, PureDP\n"
        "from privcal.storage import Ledger\n"
        f"led = Ledger('sqlite:///{tmp_path / 'l.db'}'); led.upgrade()\n"
        "acct = Accountant(led)\n"
        "acct.create_dataset('d', approx_epsilon=1, approx_delta='1e-6', subject_epsilon=2)\n"
        "acct.charge('d', ZCDP('0.01')); acct.charge('d', PureDP('0.1'))\n"
        "print(acct.budget('d').summary)\n"
        "print(ZCDP('0.5').to_approx('1e-6').eps)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[-1] == "5.22154"


def test_conversions_round_in_their_own_context() -> None:
    """Review R3 (F2): ``ZCDP.to_approx`` and ``amplify`` rounded their figure up in the
    caller's decimal context: under ``prec=5`` one raised InvalidOperation and the other
    answered "outside the range the bounds can be computed for"."""
    from decimal import ROUND_DOWN, localcontext

    from privcal.accountant.privacy.shuffle import amplify
    from privcal.costs import ZCDP

    want = (ZCDP("0.5").to_approx("1e-6"), amplify(1.0, 10_000, 1e-6))
    with localcontext() as ctx:
        ctx.prec, ctx.rounding = 5, ROUND_DOWN
        assert (ZCDP("0.5").to_approx("1e-6"), amplify(1.0, 10_000, 1e-6)) == want
    assert str(want[0].eps) == "5.22154"


def test_an_agent_message_too_large_for_a_float_is_refused() -> None:
    """Review R3 (F4): ``10**400`` as a message raised a bare OverflowError (library API)."""
    from privcal.calibrators.federated_agent import check_message
    from privcal.calibrators.fedplan import plan_fedcp_qq
    from privcal.errors import PlanRejected

    plan = plan_fedcp_qq(3, 50, 0.2)
    with pytest.raises(PlanRejected, match="is not a number"):
        check_message(10**400, plan)


def test_an_amount_is_parsed_in_its_own_context() -> None:
    """Found while killing N04: ``parse_amount`` quantized in the caller's context — under
    ``prec=6`` a plain "123.5" raised a bare InvalidOperation (the library's own methods set
    their context; a direct caller's did not)."""
    from decimal import Decimal, localcontext

    from privcal.accountant.normalize import normalize_cost, parse_amount
    from privcal.costs import PureDP

    with localcontext() as ctx:
        ctx.prec = 6
        assert parse_amount("123.5", "ε") == Decimal("123.5")
        with pytest.raises(InvalidInput, match="more than 12 decimal places"):
            parse_amount("0.1000000000001", "ε")
        assert normalize_cost(PureDP("123.456789012345")).eps == Decimal("123.456789012345")


@pytest.mark.parametrize("text", ["1_0", "\u0663", "\uff11", "0x10", "1e", " ", b"\xff", b"1_0"])
def test_an_agent_message_is_an_ascii_decimal_spelling(text: Any) -> None:
    """Red team 22, flows F1: a FedCP-QQ message was read with ``float()``, which takes "1_0"
    as 10 and "٣" as 3 — stored, and with k = 1 one such message can be the threshold. A
    message in text is an ASCII decimal number (or an infinity); the rest is refused."""
    from privcal.calibrators.federated_agent import check_message
    from privcal.calibrators.fedplan import plan_fedcp_qq
    from privcal.errors import PlanRejected

    plan = plan_fedcp_qq(3, 50, 0.2)
    with pytest.raises(PlanRejected, match="is not a number"):
        check_message(text, plan)
    assert [check_message(t, plan) for t in ("10", " 3 ", "-2.5e1", "inf", b"7")] == [
        10.0, 3.0, -25.0, float("inf"), 7.0]
