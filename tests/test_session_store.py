"""Storage of session reports: the bulk insert and the keyed probes, on every backend.

PostgreSQL writes the reports as one COPY text block and probes the primary key with the ids
as one newline-joined text when it can (issue 11); ids and values that COPY must escape, and
ids the split would lose (a newline inside, an empty id), must still round-trip exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from privcal.storage.sessions import SessionReport

PLAIN = [f"{i:064x}" for i in range(50)]  # what the ledger stores: hex pseudonyms
ODD = ["tab\there", "new\nline", "back\\slash", "carriage\rreturn", "", "ünïcode ✓"]


@pytest.mark.parametrize("subjects", [PLAIN, PLAIN + ODD], ids=["hex", "escaped"])
def test_reports_round_trip_and_probe(ledger: Any, subjects: list[str]) -> None:
    values = [f"v{i}\t" if i % 7 == 0 else str(i) for i in range(len(subjects))]
    ledger.write(lambda s: ledger.insert_reports(s, 1, 0, subjects, values, 1))
    with ledger.read() as s:
        rows = dict(s.execute(select(SessionReport.subject, SessionReport.value)
                              .where(SessionReport.session_id == 1)).all())
        assert rows == dict(zip(subjects, values, strict=True))
        # the probes: found exactly the stored ids, whatever the mix (text or array form)
        absent = ["f" * 64, "absent\nid"]
        assert ledger.reported_subjects(s, 1, subjects + absent) == set(subjects)
        assert ledger.reported_subjects(s, 1, [*PLAIN[:3], "f" * 64]) == set(PLAIN[:3])
        for odd in ODD:
            want = {odd} if odd in subjects else set()
            assert ledger.reported_subjects(s, 1, [odd, "f" * 64]) == want
        assert ledger.reported_subjects(s, 1, [""]) == ({""} if "" in subjects else set())
        assert ledger.reported_subjects(s, 2, subjects) == set()
        assert ledger.reported_subjects(s, 1, []) == set()
