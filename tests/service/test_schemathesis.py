"""schemathesis against the running server, once per role: no 5xx, no status or content type
the OpenAPI document does not declare, responses matching their schemas, and no route that
accepts a request without its token (``ignored_auth`` replays each case without it).
Examples per operation are bounded (CI time) and derandomized (reproducible)."""

from __future__ import annotations

from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis import checks  # noqa: E402

from tests.service.conftest import Live, open_fed, open_ldp  # noqa: E402

EXAMPLES = 6
CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
          checks.content_type_conformance, checks.response_schema_conformance,
          checks.ignored_auth]


@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
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
    ran = 0
    def make(op: Any) -> Any:
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            nonlocal ran
            headers = {"Authorization": f"Bearer {token}"}
            if op.method.upper() in ("POST", "PUT", "DELETE"):
                headers["Idempotency-Key"] = "schemathesis-key"
            resp = case.call(base_url=live.url, headers=headers)
            ran += 1
            try:
                case.validate_response(resp, checks=CHECKS, headers=headers)
            except Exception as exc:  # collected, all reported at the end
                failures.append(f"{op.method.upper()} {op.path}: {exc}"[:600])
                raise

        return run

    for result in schema.get_all_operations():
        try:
            make(result.ok())()
        except Exception:
            pass
    assert ran > 50
    assert not failures, "\n".join(failures[:10])
