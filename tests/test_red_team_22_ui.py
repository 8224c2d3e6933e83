"""Red team 22, ui F1: an analyst's charge ``purpose`` (any free-text field: requester,
description, key) could hold terminal control sequences — ESC[2K erased the charge's own row
of the auditor's ``privcal audit report`` on a terminal, OSC 52 wrote the auditor's clipboard.
They are refused now, in one line, nothing charged; a row stored before prints inert."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from privcal import Accountant
from privcal.cli import main
from privcal.costs import ZCDP
from privcal.errors import InvalidInput

ATTACK = "\x1b[1G\x1b[2K\x1b]52;c;cm0gLXJmIH4K\x1b\\"


@pytest.mark.parametrize(("text", "code"), [
    (ATTACK, "001B"), ("a\rb", "000D"), ("\u202eevil", "202E"), ("x\x9b2J", "009B"),
    ("bell\x07", "0007"), ("del\x7f", "007F"), ("\u2066iso", "2066")])
def test_a_control_character_in_free_text_is_refused(tmp_path: Path, text: str,
                                                      code: str) -> None:
    acct = Accountant(f"sqlite:///{tmp_path / 'l.db'}")
    acct.create_dataset("d", rho=1)
    head = acct.ledger.head()
    said = rf"holds the control character U\+{code}, which would act on a terminal"
    with pytest.raises(InvalidInput, match=r"^purpose " + said):
        acct.charge("d", ZCDP(rho="0.1"), purpose=text)
    with pytest.raises(InvalidInput, match=r"^requester " + said):
        acct.charge("d", ZCDP(rho="0.1"), requester=text)
    with pytest.raises(InvalidInput, match=r"^description " + said):
        acct.create_dataset("e", rho=1, description=text)
    assert acct.ledger.head() == head
    # a line feed and a tab are text (a multi-line purpose)
    acct.charge("d", ZCDP(rho="0.1"), purpose="line one\n\tline two")


def test_a_stored_control_sequence_prints_inert_in_the_audit_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    acct = Accountant(url)
    acct.create_dataset("d", rho=1)
    acct.charge("d", ZCDP(rho="0.9"), purpose="placeholder")
    acct.ledger.close()
    with sqlite3.connect(tmp_path / "l.db") as c:  # a row from before the rule
        c.execute("UPDATE charges SET purpose = ?", (ATTACK,))
    out = CliRunner().invoke(main, ["--db-url", url, "audit", "report"]).output
    assert "\x1b" not in out and re.search(r"\\x1b\[1G\\x1b\[2K\\x1b\]52;c;", out), out


def test_a_class_name_with_a_control_character_is_refused(tmp_path: Path) -> None:
    """ui F4: class names sent over HTTP held ESC sequences, printed raw by ``release show``
    and written raw into ``predict --out``'s header; refused now, as in dataset names."""
    import numpy as np

    acct = Accountant(f"sqlite:///{tmp_path / 'l.db'}")
    acct.create_dataset("d", rho=1, allow_nonprivate=True)
    probs = np.random.default_rng(0).dirichlet(np.ones(2), 50)
    head = acct.ledger.head()
    for name, code in (("b\x1b[2K", "001B"), ("cat\u202etac", "202E")):
        with pytest.raises(InvalidInput, match=rf"^classes: the name of column 1 \(.*\) "
                           rf"contains U\+{code} \(.*\), which does not print as itself$"):
            acct.calibrate("split", dataset="d", probs=probs, labels=np.zeros(50, int),
                           alpha=0.1, score="lac", classes=["a", name])
    assert acct.ledger.head() == head
