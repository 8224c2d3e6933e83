"""What the local methods' recorded guarantees assume of who participates (red team 15).

Honest reports are not enough if *which* reports arrive depends on the data. Red team 15
measured, every report honest: users that do not answer when their score is high, a round
of LDP-CP-S filled by whoever answers when they see the query, a forwarder dropping a
share of the 0-reports, a collector of LDP-CP-L dropping the rows whose label the model
finds implausible (a common label-cleaning step) — each gave coverage near 0.80 against a
recorded 0.9 (and 0.004 for users answering only when their score is below the query).
privcal cannot see why a report is missing, so from LDP-CP-S version 5 and LDP-CP-L
version 4 on (FedCP-QQ 1.4.0 and FedCP²-QQ 1.6.0 for which agents are used) the recorded
guarantee states it (``over`` and ``statement``, with
:func:`~privcal.calibrators.versions.clause_since`); the simulated users of ``--simulate``
are drawn by privcal and do satisfy it.
"""

from __future__ import annotations

__all__ = ["UNSELECTED_AGENTS", "UNSELECTED_LABELS", "UNSELECTED_SCORES"]

#: LDP-CP-S: who answers, in which round, and which reports a forwarder passes on
UNSELECTED_SCORES = ("which users report, in which round, and which reports are forwarded "
                     "not chosen by their data (a selection that tracks the scores can lower "
                     "the coverage)")
#: FedCP-QQ / FedCP²-QQ: which agents' messages the server uses (red team 25, fedlocal F4: a
#: session keeps the first m agents to answer and turns the rest away; ten honest agents with
#: i.i.d. data for m = 5, arriving in the order of their messages, gave coverage 0.865 against
#: a recorded 0.9 — random arrival 0.928, the plan's M). From FedCP-QQ 1.4.0 and FedCP²-QQ
#: 1.6.0 on the recorded guarantee states it (a replan for the agents that answered states
#: :data:`~privcal.calibrators.federated_agent.ANSWERED_AT_RANDOM` instead, which implies it).
#: Enforced where privcal decides who may answer (red team 25, fedlocal2): a session's agent
#: tokens are for at most its m agents (storage/agent_slots.py), a batch never takes a slot a
#: token-holding agent waits for, and one with more new agents than free slots keeps a
#: CSPRNG-random subset; still assumed for operators (ingestor, CLI, library) choosing which
#: other agents' messages to forward and when
UNSELECTED_AGENTS = ("which agents' messages are used not chosen by their data (a session "
                     "uses the first m agents to answer: an arrival order that tracks the "
                     "scores can lower the coverage)")
#: LDP-CP-L: which users' (x, ỹ) are collected and kept
UNSELECTED_LABELS = ("which users' reports are collected and kept not chosen by their data (a "
                     "selection by features or labels can lower the coverage)")

