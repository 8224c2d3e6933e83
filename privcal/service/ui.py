"""The auditor's web view ``/ui``: read-only, server-rendered (Jinja2, autoescaped), no
JavaScript at all, a strict Content-Security-Policy, and a login form that turns a token
into an HttpOnly, SameSite=Strict cookie. Admin and auditor tokens only.

Pages: datasets with budget bars and each dataset's spend over time as an inline SVG
chart; releases with their guarantees; a verify button showing the head and result.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Form, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from privcal.errors import AuditFailed

router = APIRouter(prefix="/ui", include_in_schema=False)

COOKIE = "privcal_ui"
UI_ROLES = ("admin", "auditor")
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
            "X-Frame-Options": "DENY"}

_env: Any = None


def _templates() -> Any:
    global _env
    if _env is None:
        from jinja2 import Environment, FileSystemLoader, select_autoescape

        _env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                           autoescape=select_autoescape(["html", "svg"]))
    return _env


def _page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    html = _templates().get_template(name).render(**ctx)
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


def _who(request: Request) -> Any:
    return request.scope.get("state", {}).get("principal")


def _guard(request: Request) -> Response | None:
    tok = _who(request)
    if tok is None:
        return RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
    if tok.role not in UI_ROLES:
        return _page("login.html", status=403,
                     error=f"a {tok.role} token cannot open the auditor's view")
    return None


def spend_chart(points: list[dict[str, Any]], cap: dict[str, Any], width: int = 360,
                height: int = 120) -> dict[str, Any]:
    """An SVG polyline of the spent fraction of the cap after each charge (pure geometry)."""
    key = next(iter(cap), None)
    total = float(cap[key]) if key is not None else 0.0
    ys = []
    for pt in points:
        used = pt["used_after"].get(key) if key is not None else None
        ys.append(float(used) / total if total > 0 and used is not None else 0.0)
    xs = [i / max(1, len(ys) - 1) for i in range(len(ys))] if len(ys) > 1 else [0.0, 1.0]
    if len(ys) == 1:
        ys = [ys[0], ys[0]]
    if not ys:
        xs, ys = [0.0, 1.0], [0.0, 0.0]
    pad = 4
    w, h = width - 2 * pad, height - 2 * pad
    pts = " ".join(f"{pad + x * w:.1f},{height - pad - min(1.0, y) * h:.1f}"
                   for x, y in zip(xs, ys, strict=True))
    return {"points": pts, "width": width, "height": height, "n": len(points), "key": key}


@router.get("/login", openapi_extra={"x-privcal-roles": ["public"]})
def login_form() -> HTMLResponse:
    """The login form."""
    return _page("login.html")


@router.post("/login", openapi_extra={"x-privcal-roles": ["public"]})
def login(request: Request, token: str = Form(max_length=200)) -> Response:
    """Check the token and set it as an HttpOnly SameSite=Strict cookie."""
    from privcal.storage.tokens import authenticate

    tok = authenticate(request.app.state.accountant.ledger, token.strip())
    if tok is None:
        return _page("login.html", status=401, error="invalid, expired or revoked token")
    if tok.role not in UI_ROLES:
        return _page("login.html", status=403,
                     error=f"a {tok.role} token cannot open the auditor's view")
    resp = RedirectResponse("/ui/", status_code=303, headers=_HEADERS)
    resp.set_cookie(COOKIE, token.strip(), httponly=True, samesite="strict", path="/ui",
                    secure=request.url.scheme == "https")
    return resp


@router.post("/logout", openapi_extra={"x-privcal-roles": ["public"]})
def logout() -> Response:
    """Drop the cookie."""
    resp = RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def _overview(request: Request) -> dict[str, Any]:
    from privcal.accountant.report import audit_report

    acct = request.app.state.accountant
    rows = []
    for d in acct.datasets():
        b = acct.budget(d.name)
        rep = audit_report(acct, d.name)[0]
        points = [{"used_after": t.used_after} for t in rep.timeline]
        bars = []
        for k, cap in b.cap.items():
            spent = b.spent.get(k, Decimal(0))
            frac = float(spent / cap) if cap else 0.0
            bars.append({"key": k, "cap": str(cap), "spent": str(spent),
                         "remaining": str(b.remaining.get(k, "")), "pct": round(100 * frac, 1),
                         "w": round(300 * min(frac, 1.0), 1)})
        rows.append({"name": d.name, "policy": b.policy, "bars": bars,
                     "guarantee": b.guarantee.short,
                     "spent_dp": f"ε={b.spent_dp.epsilon}, δ={b.spent_dp.delta}",
                     "charges": b.charges, "releases": b.releases,
                     "chart": spend_chart(points, b.cap)})
    rels = []
    for r in acct.releases():
        rels.append({"id": r.id, "dataset": r.dataset, "method": r.method,
                     "threshold": r.threshold, "requester": r.requester or "",
                     "coverage": getattr(r.coverage, "statement", ""),
                     "privacy": (r.privacy or {}).get("statement", ""),
                     "at": r.created_at.isoformat(timespec="seconds")})
    return {"datasets": rows, "releases": rels, "head": str(acct.ledger.head())}


@router.get("/", openapi_extra={"x-privcal-roles": list(UI_ROLES)})
def index(request: Request) -> Response:
    """Datasets (budget bars, spend chart), releases, the verify button."""
    guard = _guard(request)
    if guard is not None:
        return guard
    return _page("index.html", who=_who(request), **_overview(request))


@router.post("/verify", openapi_extra={"x-privcal-roles": list(UI_ROLES)})
def verify(request: Request) -> Response:
    """Verify the log and every release; show the head and the result."""
    guard = _guard(request)
    if guard is not None:
        return guard
    acct = request.app.state.accountant
    try:
        rep = acct.verify()
        result = {"ok": True, "text": rep.summary if hasattr(rep, "summary") else str(rep)}
    except AuditFailed as exc:
        result = {"ok": False, "text": str(exc)}
    return _page("index.html", who=_who(request), verify=result, **_overview(request))


@router.get("/static/app.css", openapi_extra={"x-privcal-roles": ["public"]})
def css() -> Response:
    """The one stylesheet (served from here: the CSP allows no other origin)."""
    text = (Path(__file__).parent / "templates" / "app.css").read_text()
    return Response(text, media_type="text/css", headers={"Cache-Control": "max-age=300"})


_ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
         '<rect width="16" height="16" rx="3" fill="#3b6ea5"/></svg>')


@router.get("/static/favicon.svg", openapi_extra={"x-privcal-roles": ["public"]})
def favicon() -> Response:
    """The page icon (so the browser does not ask the server root for one)."""
    return Response(_ICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=3600"})
