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


# --- red team 10 review, finding 1: a ZWNJ/ZWJ inside Latin, Cyrillic, CJK text (or where it
# joins nothing) renders as nothing, so "caf\u200cé" and "caf\u200dé" were two more subjects
# than "café", each with a cap of its own. A joiner now stays only between two letters or
# marks of one joining or virama script, or (a ZWJ) between two emoji.

JOINER_TWINS = [
    "caf\u200cé", "caf\u200dé",  # Latin, not ASCII
    "и\u200cван", "ива\u200dн",  # Cyrillic
    "张\u200d伟", "日\u200c本",  # CJK
    "ali\u200cce", "Ωm\u200dέγα",  # ASCII; Greek
    "\u0661\u200c\u0662",  # between two Arabic-Indic digits: nothing to join
    "ع\u200cA",  # Arabic then Latin: a ZWNJ between them separates nothing
    "س\u200dلام", "ܐ\u200dܒ",  # a ZWJ between letters of a joining script that join anyway
    "क\u200cক",  # Devanagari then Bengali: two clusters anyway
    "😀\u200c😀",  # a ZWNJ between emoji
    "🇫\u200d🇷",  # regional indicators do not make ZWJ sequences
    "ب\u200c\u200dت",  # two joiners in a row
    "👮\u200d♀\ufe0f", "🏳\ufe0f\u200d🌈",  # U+FE0F, a variation selector: refused anyway
]


@pytest.mark.parametrize("twin", JOINER_TWINS)
def test_a_joiner_that_changes_nothing_on_screen_is_refused(twin: str) -> None:
    assert invisible_char(twin) in ("\u200c", "\u200d", "\ufe0f")
    with pytest.raises(InvalidInput, match=r"invisible or blank character U\+(200C|200D|FE0F)"):
        id_strings(["bob", twin], "subject ids")


@pytest.mark.parametrize("ok", [
    "علی\u200cرضا", "می\u200cخواهم",  # Persian ZWNJ
    "ܐ\u200cܒ",  # Syriac
    "क्\u200dष", "क्\u200cष",  # Hindi: a half form, a visible virama
    "ශ්\u200dරී", "ක\u200d්ව",  # Sinhala: ZWJ after, and before, the al-lakuna
    "র\u200d্য",  # Bengali ra + ZWJ + virama + ya
    "👩\u200d💻", "👩🏽\u200d💻", "👨\u200d👩\u200d👧", "🐻\u200d❄",  # emoji ZWJ sequences
])
def test_a_joiner_that_shapes_its_script_or_an_emoji_stays(ok: str) -> None:
    assert invisible_char(ok) is None
    assert id_strings([ok], "subject ids").tolist() == [ok]


def test_cafe_is_one_subject_whatever_the_joiners(accountant: Accountant) -> None:
    accountant.create_dataset("users", epsilon=3, subject_epsilon=1)
    assert accountant.charge_subjects("users", 1, ["café"]).accepted == 1
    for twin in ("caf\u200cé", "caf\u200dé", "café\u200d"):
        with pytest.raises(InvalidInput, match="invisible or blank character"):
            accountant.charge_subjects("users", 1, [twin])
    summary = accountant.subject_summary("users")
    assert summary.subjects == 1 and summary.max == 1
    with pytest.raises(InvalidInput, match="reads as nothing"):
        accountant.create_dataset("caf\u200dé", epsilon=1)


def test_a_token_subject_with_a_joiner_in_latin_text_is_refused(accountant: Accountant) -> None:
    from privcal.accountant import sessions as S

    accountant.create_dataset("users", approx_epsilon=5, approx_delta="1e-6",
                              subject_epsilon=10)
    sid = S.open_session(accountant, "ldp-score", dataset="users", alpha=0.1, epsilon=1.0,
                         rounds=2, group_size=10).id
    with pytest.raises(InvalidInput, match="reads as nothing"):
        create_token(accountant.ledger, "device", session=sid, subject="caf\u200cé")
    assert create_token(accountant.ledger, "device", session=sid,
                        subject="علی\u200cرضا").token


# ------------------------------------------- reviewed (r10rev 8): data made before the rule
def test_a_release_made_before_the_rule_still_predicts_for_its_own_groups(
        accountant: Accountant, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Mondrian release whose groups are ``☀️``/``☁️`` (with U+FE0F), calibrated before
    the rule, still predicts for exactly those groups; any other spelling is refused."""
    from privcal.calibrators import validation

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), 400)
    labels = rng.integers(0, 3, 400)
    groups = rng.choice(["\u2600\ufe0f", "\u2601\ufe0f"], size=400)
    accountant.create_dataset("s", rho="1", allow_nonprivate=True)
    with monkeypatch.context() as m:  # the code before: no rule for these characters
        m.setattr(validation, "invisible_char", lambda v: None)
        m.setattr(validation, "READS_AS_NOTHING", __import__("re").compile("(?!)"))
        rel = accountant.calibrate("split", dataset="s", probs=probs, labels=labels,
                                   score="lac", alpha=0.2, groups=groups, public_groups=True)
    test = rng.dirichlet(np.ones(3), 20)
    tg = rng.choice(["\u2600\ufe0f", "\u2601\ufe0f"], size=20)
    sets = rel.predict_set(test, groups=tg)
    assert sets.shape == (20, 3)
    with pytest.raises(InvalidInput, match="invisible or blank character"):
        rel.predict_set(test, groups=np.array(["\u2600\ufe0f"] * 19 + ["\u2600\u034f"]))
    with pytest.raises(InvalidInput, match="invisible or blank character"):
        id_strings(tg, "groups")  # new data still meets the rule
