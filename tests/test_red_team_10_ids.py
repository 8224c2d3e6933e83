"""Red team 10 (r10fuzz F1): characters that render as nothing although Python calls them
printable made one person several subjects, each with a cap of its own.

Red team 6 refused ids holding a character ``str.isprintable()`` rejects (``alice\\u200b``).
The variation selectors (U+FE0F, U+E0100…), the combining grapheme joiner U+034F, the Hangul
fillers (U+3164, U+FFA0, U+115F, U+1160), the Khmer inherent vowels, the Mongolian free
variation selectors, the soft hyphen… and U+2800 BRAILLE PATTERN BLANK are printable to
Python: ``alice`` and eight such twins were charged a cap of 1 each (9 in all); an id made
of one Hangul filler was accepted; dataset and token names took them too. One rule now
(:func:`privcal.errors.invisible_char`: Unicode's Default_Ignorable_Code_Point set and
U+2800) for subject and agent ids, token subjects and agents, and dataset and token names.
"""

from __future__ import annotations

import numpy as np
import pytest

from privcal.accountant import Accountant
from privcal.calibrators.validation import id_strings
from privcal.errors import InvalidInput, invisible_char
from privcal.storage.tokens import create_token

TWINS = ["alice\u034f", "alice\ufe0f", "alice\U000e0100", "alice\u180b", "alice\u17b4",
         "alice\u3164", "alice\uffa0", "alice\u2800", "a\u115flice", "\u3164", "\u2800"]


@pytest.mark.parametrize("twin", TWINS)
def test_an_id_that_reads_as_another_is_refused(twin: str) -> None:
    assert twin.isprintable()  # what red team 6's check asked
    with pytest.raises(InvalidInput, match="invisible or blank character"):
        id_strings(["bob", twin], "subject ids")
    assert invisible_char(twin) is not None


@pytest.mark.parametrize("ok", ["alice", "علی\u200cرضا", "👩\u200d💻", "données", "日本語",
                                "a b", "Ω-7"])
def test_visible_spellings_stay_ids(ok: str) -> None:
    assert id_strings([ok], "subject ids").tolist() == [ok]
    assert invisible_char(ok) is None


def test_a_joiner_between_ascii_letters_is_still_refused() -> None:
    with pytest.raises(InvalidInput, match="U\\+200D"):
        id_strings(["al\u200dice"], "subject ids")


def test_twins_are_not_charged_as_other_subjects(accountant: Accountant) -> None:
    accountant.create_dataset("users", epsilon=1, subject_epsilon=1)
    first = accountant.charge_subjects("users", 1, ["alice"])
    assert first.accepted == 1
    for twin in TWINS[:4]:
        with pytest.raises(InvalidInput, match="invisible or blank character"):
            accountant.charge_subjects("users", 1, [twin])
    summary = accountant.subject_summary("users")
    assert summary.subjects == 1 and summary.max == 1


@pytest.mark.parametrize("name", ["x\ufe0f", "\u3164\u3164", "d\u2800", "d\u034f"])
def test_dataset_names_that_read_as_another_are_refused(accountant: Accountant,
                                                        name: str) -> None:
    with pytest.raises(InvalidInput, match="reads as nothing"):
        accountant.create_dataset(name, epsilon=1)
    assert accountant.datasets() == []


def test_token_names_subjects_and_agents_that_read_as_another_are_refused(
        accountant: Accountant) -> None:
    from privcal.accountant import sessions as S

    accountant.create_dataset("users", approx_epsilon=5, approx_delta="1e-6",
                              subject_epsilon=10)
    sid = S.open_session(accountant, "ldp-score", dataset="users", alpha=0.1, epsilon=1.0,
                         rounds=2, group_size=10).id
    led = accountant.ledger
    for kw in ({"role": "admin", "name": "ops\ufe0f"},
               {"role": "device", "session": sid, "subject": "phone-1\ufe0f"},
               {"role": "device", "session": sid, "subject": "\u3164"},
               {"role": "agent", "session": sid, "agent": "h\u034f1"}):
        with pytest.raises(InvalidInput, match="reads as nothing"):
            create_token(led, **kw)  # type: ignore[arg-type]
    assert create_token(led, "device", session=sid, subject="phone-1").token
    assert np.asarray(id_strings(["phone-1"], "subject")).tolist() == ["phone-1"]
