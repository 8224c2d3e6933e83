"""What the local methods' recorded guarantees assume of who participates (red team 15).

Honest reports are not enough if *which* reports arrive depends on the data. Red team 15
measured, every report honest: users that do not answer when their score is high, a round
of LDP-CP-S filled by whoever answers when they see the query, a forwarder dropping a
share of the 0-reports, a collector of LDP-CP-L dropping the rows whose label the model
finds implausible (a common label-cleaning step) — each gave coverage near 0.80 against a
recorded 0.9 (and 0.004 for users answering only when their score is below the query).
privcal cannot see why a report is missing, so from LDP-CP-S version 5 and LDP-CP-L
version 4 on the recorded guarantee states it (``over`` and ``statement``, with
:func:`~privcal.calibrators.versions.clause_since`); the simulated users of ``--simulate``
are drawn by privcal and do satisfy it.
"""

from __future__ import annotations

__all__ = ["UNSELECTED_LABELS", "UNSELECTED_SCORES"]

#: LDP-CP-S: who answers, in which round, and which reports a forwarder passes on
UNSELECTED_SCORES = ("which users report, in which round, and which reports are forwarded "
                     "not chosen by their data (a selection that tracks the scores can lower "
                     "the coverage)")
#: LDP-CP-L: which users' (x, ỹ) are collected and kept
UNSELECTED_LABELS = ("which users' reports are collected and kept not chosen by their data (a "
                     "selection by features or labels can lower the coverage)")

