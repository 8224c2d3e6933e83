"""schemathesis against the running server, once per role and backend (SQLite; PostgreSQL
when $PRIVCAL_TEST_DATABASE_URL is set): no 5xx, no status or content type the OpenAPI
document does not declare, responses matching their schemas, no route that accepts a
request without its token (``ignored_auth`` replays each case without it), and a case
answered ≥ 400 changes nothing — every row of every table of the ledger is the same after
it (and after the checks' replays) as before (:func:`~tests.service.conftest.ledger_snapshot`,
no table excluded). Examples per operation are bounded (CI time) and derandomized
(reproducible)."""

from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import checks  # noqa: E402

from tests.service.conftest import Live, ledger_snapshot, open_fed, open_ldp  # noqa: E402

EXAMPLES = 6
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance,
          checks.ignored_auth]


def _changed(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The tables whose rows differ, with a few of the rows added and removed."""
    out = []
    for name in sorted(set(before) | set(after)):
        b, a = set(before.get(name, [])), set(after.get(name, []))
        if a != b:
            out.append(f"{name}: +{sorted(a - b)[:2]} -{sorted(b - a)[:2]}")
    return "; ".join(out)[:400]


@pytest.mark.parametrize("role", ["admin", "analyst", "auditor", "device", "agent", "ingestor"])
def test_schemathesis_per_role(live: Live, role: str) -> None:
    sid = open_ldp(live, group_size=100)
    token = live.tokens.get(role) or {
        "device": lambda: live.token("device", session=sid, subject="st-1"),
        "agent": lambda: live.token("agent", session=open_fed(live), agent="ag-1"),
        "ingestor": lambda: live.token("ingestor", session=sid),
    }[role]()
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json")
    failures: list[str] = []
    ran = refused = 0
    # the ledger as the last refused case left it (None: a case that succeeded may have
    # written since, so the next case takes a fresh snapshot first)
    last: dict[str, Any] | None = None

    def make(op: Any) -> Any:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            nonlocal ran, refused, last
            headers = {"Authorization": f"Bearer {token}"}
            if op.method.upper() in ("POST", "PUT", "DELETE"):
                headers["Idempotency-Key"] = "schemathesis-key"
            before = last if last is not None else ledger_snapshot(live)
            resp = case.call(base_url=live.url, headers=headers)
            ran += 1
            try:
                case.validate_response(resp, checks=CHECKS, headers=headers)
                if resp.status_code >= 400:
                    refused += 1
                    last = ledger_snapshot(live)
                    assert last == before, (f"answered {resp.status_code} but changed the "
                                            f"ledger: {_changed(before, last)}")
                else:
                    last = None
            except Exception as exc:  # collected, all reported at the end
                last = None
                failures.append(f"{op.method.upper()} {op.path}: {exc}"[:600])
                raise

        return run

    for result in schema.get_all_operations():
        try:
            make(result.ok())()
        except Exception:
            pass
    assert ran > 50 and refused > 20
    assert not failures, "\n".join(failures[:10])
