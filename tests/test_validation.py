"""Input checks: each bad input gets one InvalidInput line naming the problem (and row)."""

from __future__ import annotations

import numpy as np
import pytest

from privcal.calibrators.validation import (
    check_labels,
    check_lengths,
    check_probs,
    check_scores,
    check_targets,
)
from privcal.errors import InvalidInput


def _one_line(exc: pytest.ExceptionInfo[InvalidInput]) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


def test_check_scores_clean():
    out = check_scores([1, 2, 3])
    assert out.dtype == np.float64 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, [1.0, 2.0, 3.0])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_check_scores_names_the_bad_row(bad):
    a = np.array([0.1, 0.2, bad, 0.4, np.nan])
    with pytest.raises(InvalidInput) as exc:
        check_scores(a)
    assert "row 2" in _one_line(exc)


def test_check_scores_inf_allowed_when_asked_but_not_nan():
    out = check_scores([0.1, np.inf, -np.inf], allow_inf=True)
    assert np.isinf(out[1])
    with pytest.raises(InvalidInput, match="row 1"):
        check_scores([0.1, np.nan, np.inf], allow_inf=True)


def test_check_scores_huge_finite_values_pass():
    # their sum overflows to inf; the fast path must fall back to the exact check
    out = check_scores([1e308, 1e308, -5.0])
    assert np.isfinite(out).all()


@pytest.mark.parametrize(
    ("bad", "fragment"),
    [
        ([0.5], "at least 2 rows"),
        ([], "at least 2 rows"),
        ([[0.1, 0.2], [0.3, 0.4]], "1-D"),
        (["a", "b"], "numeric"),
        ([True, False], "numeric"),
    ],
)
def test_check_scores_shape_and_type(bad, fragment):
    with pytest.raises(InvalidInput, match=fragment) as exc:
        check_scores(bad)
    _one_line(exc)


def test_check_probs_clean_and_tolerance():
    p = np.array([[0.2, 0.8], [0.5, 0.5 + 5e-7]])
    out = check_probs(p)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, p)


def test_check_probs_row_sum_names_row_and_sum():
    p = np.array([[0.2, 0.8], [0.5, 0.5], [0.3, 0.6]])
    with pytest.raises(InvalidInput) as exc:
        check_probs(p)
    msg = _one_line(exc)
    assert "row 2" in msg and "0.9" in msg


@pytest.mark.parametrize(
    ("p", "fragment"),
    [
        (np.array([0.5, 0.5]), "2-D"),
        (np.ones((3, 2, 1)), "2-D"),
        (np.array([[0.5, 0.5]]), "at least 2 rows"),
        (np.array([[1.0], [1.0]]), "at least 2 classes"),
        (np.array([[0.5, 0.5], [1.2, -0.2]]), "row 1, column 1 is negative"),
        (np.array([[0.5, np.nan], [0.5, 0.5]]), "row 0, column 1"),
    ],
)
def test_check_probs_errors(p, fragment):
    with pytest.raises(InvalidInput, match=fragment) as exc:
        check_probs(p)
    _one_line(exc)


def test_check_labels():
    out = check_labels([0, 2, 1], 3)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, [0, 2, 1])
    np.testing.assert_array_equal(check_labels(np.array([0.0, 2.0]), 3), [0, 2])


@pytest.mark.parametrize(
    ("y", "fragment"),
    [
        ([0, 3, 1], "row 1 is 3, outside \\[0, 3\\)"),
        ([0, -1], "row 1 is -1"),
        ([0.0, 1.5], "row 1 is 1.5, not an integer"),
        ([0.0, np.nan], "row 1 is nan"),
        ([1], "at least 2 rows"),
        ([[0, 1]], "1-D"),
    ],
)
def test_check_labels_errors(y, fragment):
    with pytest.raises(InvalidInput, match=fragment) as exc:
        check_labels(y, 3)
    _one_line(exc)


def test_check_targets_and_lengths():
    np.testing.assert_array_equal(check_targets([1, 2]), [1.0, 2.0])
    with pytest.raises(InvalidInput, match="row 1"):
        check_targets([1.0, np.inf])
    assert check_lengths(a=np.zeros(3), b=np.zeros((3, 2))) == 3
    with pytest.raises(InvalidInput, match="probs has 3, labels has 2") as exc:
        check_lengths(probs=np.zeros((3, 2)), labels=np.zeros(2))
    _one_line(exc)


def test_shape_sizes_and_federated_groups_share_one_agent_order() -> None:
    """Agents 2 and 10 sort differently as numbers and as strings: the per-agent sizes in the
    shape and the calibrator's groups must still pair up position by position."""
    from privcal.calibrators.base import CalibrationInput
    from privcal.calibrators.fedcp_qq import group_by_agent
    from privcal.calibrators.validation import group_sizes, id_strings

    agents = np.array([2, 10, 10, 10, 2])  # ids are read as text or integers, never floats
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    assert list(id_strings(agents)) == ["2", "10", "10", "10", "2"]
    with pytest.raises(InvalidInput, match="not floats"):  # issue 14.4: a float merges ids
        id_strings(agents.astype(float))
    sizes = group_sizes(agents)
    groups = group_by_agent(CalibrationInput(scores=scores, agents=agents))
    assert sizes == (3, 2)  # "10" then "2"
    assert [g.size for g in groups] == list(sizes)
    np.testing.assert_array_equal(groups[0], [0.2, 0.3, 0.4])
