"""Re-checking what was released: the hash chain, and every recorded guarantee recomputed.

An auditor should not have to trust whoever wrote a release row. The ledger's
own :meth:`~privcal.storage.Ledger.verify` proves the log is intact (every
hash, every row against its entry); this module then recomputes, with the
*installed* calibrator code, each release's coverage guarantee and privacy
guarantee from its stored parameters and public shape, and flags any
difference (DESIGN.md: "Every guarantee can be recomputed").
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict

from privcal.accountant.normalize import cost_json, json_safe, normalize_cost
from privcal.accountant.release_privacy import privacy_record
from privcal.calibrators import registry
from privcal.calibrators.base import DataShape
from privcal.errors import AuditFailed, PrivcalError
from privcal.storage.records import VerifyReport

#: recorded floats went through JSON; anything beyond this is a real difference
REL_TOL = 1e-9


class ReleaseCheck(BaseModel):
    """The result of recomputing one release's guarantees."""

    model_config = ConfigDict(frozen=True)

    release: int
    dataset: str
    method: str
    ok: bool
    problems: list[str]


class AuditReport(VerifyReport):
    """A verified log (the storage's :class:`~privcal.storage.records.VerifyReport`) and the
    number of releases whose guarantees were recomputed."""

    guarantees_recomputed: int

    @property
    def summary(self) -> str:
        signed = ""
        if self.signed_through is not None:
            signed = f"; signed by the trusted key through entry {self.signed_through}"
            if self.unsigned_entries:
                signed += f", {self.unsigned_entries} later entries unsigned"
        queued = ""
        if self.queued:
            since = self.queued_since.strftime("%Y-%m-%d %H:%M:%S") if self.queued_since else "?"
            queued = (f"; {self.queued} more entr{'y' if self.queued == 1 else 'ies'} committed "
                      f"(oldest {since} UTC) but not yet chained: still in the audit queue, "
                      "checked against their rows (not covered by the head; any write, or "
                      "`privcal audit head` with write access, chains them)")
        return (
            f"ok: {self.entries} log entries verify (head {self.head}){signed}{queued}; "
            f"{self.guarantees_recomputed} release guarantees recomputed and match"
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if math.isinf(a) or math.isinf(b) or math.isnan(a) or math.isnan(b):
            return a == b or (math.isnan(a) and math.isnan(b))
        return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


#: human sentences: their numbers are compared in the structured fields, and their wording may
#: change between versions without the guarantee changing (the hash chain protects the row);
#: ``over`` and ``neighbouring`` are such wording (releases recorded before issue 14.7 have
#: no ``neighbouring``)
NOT_COMPARED = frozenset({"statement", "over", "neighbouring"})


def _diff(what: str, recorded: dict[str, Any], recomputed: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted((set(recorded) | set(recomputed)) - NOT_COMPARED):
        if not _same(recorded.get(key), recomputed.get(key)):
            out.append(
                f"{what}.{key}: recorded {recorded.get(key)!r}, recomputed {recomputed.get(key)!r}"
            )
    return out


def _plain(obj: Any) -> Any:
    """What a JSON column gives back: the form in which recorded values are compared."""
    return json.loads(json.dumps(json_safe(obj), default=str))


def _made_by(rel: Any, reg: registry.Registered) -> bool:
    """Whether release ``rel`` was recorded by the calibrator registered as its method. Also
    the two forms a calibrator object passed by a caller was recorded under before
    provenance was checked (privcal 0.x): ``Accountant.run`` wrote ``privcal`` and an empty
    version, ``calibrate`` its class's top-level package and ``unknown``."""
    if rel.distribution == reg.distribution:
        return True
    cal = reg.calibrator
    while getattr(cal, "inner", None) is not None:  # a wrapper records its method's origin
        cal = cal.inner
    package = type(cal).__module__.split(".")[0]
    return ((rel.distribution, rel.distribution_version) == ("privcal", "")
            or (rel.distribution, rel.distribution_version) == (package, "unknown"))


def check_release(accountant: Any, rel: Any) -> ReleaseCheck:
    """Recompute one release's coverage and privacy guarantees from its stored inputs."""
    from privcal.accountant.amplification import shuffled_guarantee
    from privcal.accountant.prepare import validate_params
    problems: list[str] = []
    try:
        reg = registry.get(rel.method)
    except PrivcalError as exc:
        return ReleaseCheck(release=rel.id, dataset=rel.dataset, method=rel.method, ok=False,
                            problems=[f"cannot recompute: {exc}"])  # fmt: skip
    cal = reg.calibrator
    if not _made_by(rel, reg):  # another package's mechanism under this name
        problems.append(f"made by {rel.distribution!r}, but the installed {rel.method} comes "
                        f"from {reg.distribution!r}: its guarantee cannot be recomputed")
    # a release of an older calibrator version is recomputed by the formula it was made with:
    # the calibrator lists the parameter values that select it (issue 13)
    legacy = getattr(cal, "legacy_params", {}).get(rel.calibrator_version)
    if cal.version != rel.calibrator_version and legacy is None:
        problems.append(
            f"calibrator version: recorded {rel.calibrator_version}, installed {cal.version}"
        )
    try:
        params = validate_params(cal, {**(legacy or {}), **rel.params})
        shape = DataShape.model_validate(rel.shape)
        # an older version's recorded text, where a calibrator's changed between versions
        as_version = getattr(cal, "guarantee_as", None)
        coverage = (as_version(rel.calibrator_version, params, shape)
                    if as_version is not None and rel.calibrator_version != cal.version
                    else cal.guarantee(params, shape)).model_dump(mode="json")  # fmt: skip
        recorded_cov = (
            rel.coverage if isinstance(rel.coverage, dict) else rel.coverage.model_dump(mode="json")
        )
        problems += _diff("coverage", _plain(recorded_cov), _plain(coverage))
        if hasattr(cal, "check_record"):  # a levels/Mondrian wrapper: its stored thresholds
            problems += cal.check_record(params, shape, rel.threshold, rel.diagnostics or {})
        cost = cal.cost(params, shape)
        ds = accountant.dataset(rel.dataset)
        extra = (rel.privacy or {}).get("extra")
        new_extra = None
        central_cost = None
        if extra and extra.get("shuffled"):
            central_cost, new_extra = shuffled_guarantee(
                rel.method, params, shape, ds.reporting_delta,
                assume_unlinkable_features="assumption" in extra,
            )  # fmt: skip
        privacy = privacy_record(cost, ds, new_extra, cal)
        if central_cost is not None and ds.notion == "approx":  # charged to the dataset (run)
            privacy["central_cost"] = cost_json(normalize_cost(central_cost))
        problems += _diff("privacy", _plain(rel.privacy), _plain(privacy))
    except PrivcalError as exc:
        problems.append(f"cannot recompute: {exc}")
    return ReleaseCheck(release=rel.id, dataset=rel.dataset, method=rel.method,
                        ok=not problems, problems=problems)  # fmt: skip


def verify(accountant: Any, expect_head: str | None = None, **signed: Any) -> AuditReport:
    """Verify the log, then every release's guarantees; raise :class:`AuditFailed` on the first
    release whose recorded guarantee the installed code does not reproduce. ``signed``:
    ``signed_head``, ``trusted_key``, ``allow_unsigned_tail`` and ``progress`` of
    :meth:`privcal.storage.Ledger.verify`."""
    rep = accountant.ledger.verify(expect_head=expect_head, **signed)
    checked = 0
    for rel in accountant.ledger.releases():
        res = check_release(accountant, rel)
        if not res.ok:
            raise AuditFailed(
                f"release {res.release} ({res.method} on {res.dataset!r}) does not recompute: "
                + "; ".join(res.problems[:3])
            )
        checked += 1
    return AuditReport(**rep.model_dump(), guarantees_recomputed=checked)
