"""Red team 10 (r10fuzz), inputs nobody tried: findings 4 and 6 (finding 5, the HTTP one, is in
tests/service/test_red_team_10_inputs_service.py).

4. ``advise --slack 1e-12`` ran for hours (``_min_n`` stepped n by one from ~10²⁴): now a
   galloping search and bisection, which finds the n the one-step walk found.
6. A parquet subject column of type decimal(10, 2) read as "7.00" (another person than an
   int64 7) and a bool column as "true"/"false": refused in one line, as floats are.
"""

from __future__ import annotations

import decimal
import json
import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privcal.calibrators import advisor
from privcal.calibrators.advisor import advise, min_n_label, min_n_score
from privcal.calibrators.ldp_label import label_slack
from privcal.calibrators.ldp_score_bounds import score_slack
from privcal.data.files import load_array, load_reports
from privcal.errors import InvalidInput

# ------------------------------------------------------------------ 4. advise --slack, small


def _old_min_n(value_at: Any, c: float, slack: float) -> int:
    """The search before red team 10, verbatim: the reference the new one must match."""
    n = max(1, math.ceil((c / slack) ** 2))
    while value_at(n) > slack:
        n += 1
    while n > 1 and value_at(n - 1) <= slack:
        n -= 1
    return n


@contextmanager
def _within(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging if the block runs longer than ``seconds``."""

    def expire(*_: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


_CLI = "import sys; from privcal.cli.app import main; sys.exit(main())"


def test_advise_with_a_tiny_slack_answers_at_once() -> None:
    """``privcal advise --slack 1e-12`` / ``1e-16`` (and ``POST /v1/advise``, the same library
    call) ran for minutes to hours; in a subprocess so that a regression fails, not hangs
    (each call's 20 s timeout: a sum of wall times on a shared 2-core machine measured the
    load, not the fix — 11 s under a load of 5)."""
    for slack in ("1e-12", "1e-16"):
        try:
            p = subprocess.run(
                [sys.executable, "-c", _CLI, "--db-url", "sqlite://", "--json", "advise",
                 "--n", "1000", "--k", "10", "--epsilon", "2", "--alpha", "0.1",
                 "--slack", slack], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"advise --slack {slack} still running after 20 s")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        for method in ("label", "score"):
            n = doc[method]["min_n"]
            assert isinstance(n, int) and n > 10**20


@pytest.mark.parametrize("slack", [1e-12, 1e-16, 1e-30, 1e-100])
def test_min_n_is_the_smallest_n_reaching_the_slack(slack: float) -> None:
    """The answer passes and the n below it does not (the predicate is monotone in n)."""
    with _within(2):
        adv = advise(1000, 10, 2.0, 0.1, slack=slack)
    n = adv.label.min_n
    assert n is not None and n > 1

    def lab(m: int) -> float:
        return label_slack(m, 10, 2.0, 0.001).delta_L

    assert lab(n) <= slack < lab(n - 1)
    g, t = adv.score.min_n // adv.score.rounds, adv.score.rounds  # type: ignore[operator]
    assert score_slack(g, t, 2.0, 0.001) <= slack < score_slack(g - 1, t, 2.0, 0.001)


def test_a_slack_past_the_float_range_is_one_line() -> None:
    """(c/slack)² overflows a float: a one-line InvalidInput, as before (not a hang)."""
    with pytest.raises(InvalidInput, match="outside the range"):
        advise(1000, 10, 2.0, 0.1, slack=1e-200)


def test_the_new_search_gives_the_old_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a grid of ordinary inputs (n up to ~10¹¹) min_n_label and min_n_score answer
    exactly what the one-step walk answered."""
    label_cases = [(k, eps, slack, delta, bound)
                   for k in (2, 3, 10, 100) for eps in (0.3, 1.0, 2.0, 4.0, 8.0)
                   for slack in (5.0, 0.9, 0.3, 0.1, 0.03, 1e-3, 1e-5) for delta in (0.001, 0.05)
                   for bound in ("proven", "paper")]
    score_cases = [(eps, slack, delta, rounds)
                   for eps in (0.3, 1.0, 2.0, 8.0) for slack in (2.0, 0.5, 0.1, 0.01, 1e-4)
                   for delta in (0.001, 0.05) for rounds in (1, 3, 10, 64)]
    new_l = [min_n_label(*c) for c in label_cases]  # type: ignore[arg-type]
    new_s = [min_n_score(*c) for c in score_cases]
    monkeypatch.setattr(advisor, "_min_n", _old_min_n)
    assert [min_n_label(*c) for c in label_cases] == new_l  # type: ignore[arg-type]
    assert [min_n_score(*c) for c in score_cases] == new_s
    assert min(new_l) == 1 and max(new_l) > 10**10  # both ends of the search are exercised


def test_the_search_on_a_step_function() -> None:
    """Every position of the answer relative to the closed-form guess (above it, below it,
    at it, at n = 1)."""
    for answer in (1, 2, 3, 7, 100, 101, 1000, 1234):
        for guess_c in (0.5, 1.0, 10.0, 31.6, 99.0):

            def value_at(m: int, answer: int = answer) -> float:
                return 1.0 if m < answer else 0.5

            assert advisor._min_n(value_at, guess_c, 0.75) == answer
            assert _old_min_n(value_at, guess_c, 0.75) == answer


# ------------------------------------------------------------------ 6. parquet id column types


def _write(path: Path, arr: pa.Array, **extra: pa.Array) -> str:
    pq.write_table(pa.table({"subject": arr, **extra}), path)
    return str(path)


@pytest.mark.parametrize(("arr", "shown"), [
    (pa.array([decimal.Decimal(7), decimal.Decimal(8)], pa.decimal128(10, 2)), "decimal128(10, 2)"),
    (pa.array([decimal.Decimal(7), decimal.Decimal(8)], pa.decimal128(20, 0)), "decimal128(20, 0)"),
    (pa.array([True, False]), "bool"),
    (pa.array([7.0, 8.0]), "double"),
    (pa.array([7.0, 8.0], pa.float32()), "float"),
    (pa.array([decimal.Decimal(7), decimal.Decimal(8)]).dictionary_encode(), "decimal"),
])
def test_parquet_ids_of_decimal_bool_or_float_type_are_refused(
        tmp_path: Path, arr: pa.Array, shown: str) -> None:
    """They were read as "7.00" / "true" (decimal, bool): one line naming the type."""
    spec = _write(tmp_path / "ids.parquet", arr)
    with pytest.raises(InvalidInput) as err:
        load_array(spec, "subjects", ids=True)
    msg = str(err.value)
    assert "\n" not in msg and shown in msg and "ids must be text or integers" in msg
    assert "'subject'" in msg
    # the same column selected by name in a wider table, and as a report batch's id column
    wide = _write(tmp_path / "wide.parquet", arr, bit=pa.array([0, 1]))
    with pytest.raises(InvalidInput, match="ids must be text or integers"):
        load_array(wide + ":subject", "subjects", ids=True)
    with pytest.raises(InvalidInput, match="ids must be text or integers"):
        load_reports(wide, "subject", "bit")


@pytest.mark.parametrize("arr", [
    pa.array([7, 8], pa.int64()), pa.array([7, 8], pa.uint8()), pa.array(["7", "8"]),
    pa.array(["7", "8"], pa.large_string()), pa.array(["7", "8"]).dictionary_encode(),
    pa.array([7, 8], pa.int32()).dictionary_encode(),
])
def test_parquet_ids_of_text_or_integer_type_are_read(tmp_path: Path, arr: pa.Array) -> None:
    spec = _write(tmp_path / "ids.parquet", arr, score=pa.array([0.5, 0.25]))
    assert load_array(spec + ":subject", "subjects", ids=True).tolist() == ["7", "8"]
    ids, values, _ = load_reports(spec, "subject", "score")
    assert ids.tolist() == ["7", "8"] and values.tolist() == [0.5, 0.25]


def test_other_parquet_columns_are_not_ids(tmp_path: Path) -> None:
    """The check is on the id column only: float and bool columns beside it still read."""
    spec = _write(tmp_path / "t.parquet", pa.array([7, 8]), s=pa.array([0.5, 0.25]),
                  b=pa.array([True, False]))
    assert load_array(spec + ":s", "scores").tolist() == [0.5, 0.25]
    assert load_array(spec + ":subject", "subjects", ids=True).tolist() == ["7", "8"]
    np.testing.assert_array_equal(load_array(spec + ":b", "labels"), [True, False])
