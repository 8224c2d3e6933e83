"""The auditor's web view ``/ui``: read-only, server-rendered (Jinja2, autoescaped), no
JavaScript at all, a strict Content-Security-Policy, and a login form that checks a token
and sets an HttpOnly, SameSite=Strict cookie (Secure under https). Admin and auditor
tokens only.

The cookie is a UI-only credential, never the bearer token: cookies are scoped by host,
not port, so any other service on the same host name receives it, and the token itself
would open the whole ``/v1`` API. It is ``<token id>.<issued at>.<MAC>``, an HMAC-SHA256
under a key derived from the ledger's secret (the same for every worker process; a
restart keeps sessions); ``/v1`` refuses it (not a bearer token). It opens ``/ui`` only,
for at most :data:`UI_SESSION` seconds, and only while its token is in force: revoking or
expiring the token ends the session at its next request. Logging out drops the cookie
from the browser (a copy taken before stays valid until one of those ends).

The cookie is read by :func:`cookie_credential`, a linear scan of the raw header: never
:class:`http.cookies.SimpleCookie` (whose unquoting is quadratic in backslashes on this
Python, CVE-2024-7592, and ran on the event loop: one header froze the server), nor
Starlette's ``request.cookies`` (the same unquoting).

Pages: datasets with budget bars and each dataset's spend over time as an inline SVG
chart; releases with their guarantees; a verify button showing the head and result.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import time
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.types import Scope

from privcal.calibrators.bound_floats import float_text
from privcal.errors import AuditFailed, PrivcalError, with_article
from privcal.service.json_body import JsonRoute
from privcal.storage.token_secrets import TOKEN_ID

if TYPE_CHECKING:
    from privcal.storage.tokens import TokenInfo

#: :class:`~privcal.service.json_body.JsonRoute`: the UI's URLs are checked as the API's are
#: (:mod:`privcal.service.query_params`: a query parameter given twice, or one a form POST
#: does not declare, is a one-line 422 before the handler runs)
router = APIRouter(prefix="/ui", include_in_schema=False, route_class=JsonRoute)

COOKIE = "privcal_ui"
UI_ROLES = ("admin", "auditor")
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
            "X-Frame-Options": "DENY"}

#: the longest a UI session lasts (seconds), whatever the token's own expiry
UI_SESSION = 12 * 3600
#: Cookie headers longer than this in all are ignored (the page asks to log in): the UI's
#: credential is 71 bytes, and a browser's cookie is at most 4 KiB
COOKIE_HEADER_MAX = 8 * 1024
_CREDENTIAL = re.compile(rf"({TOKEN_ID})\.([0-9]{{10}})\.([A-Za-z0-9_-]{{43}})".encode())
_MAC_LABEL = b"privcal ui session v1\x00"
#: the label the MAC key is derived under (NUL: never a subject id's UTF-8)
_KEY_LABEL = b"privcal ui cookie key v2\x00"

_env: Any = None


def ui_key(ledger: Any) -> bytes:
    """The MAC key of UI credentials: derived from the ledger's secret (never sent; the
    same for every worker process on one ledger, so any of them can check the cookie). Its
    label ends in NUL, which no subject id holds: a subject's pseudonym is the HMAC of its
    id under the same secret, and the label without NUL was a valid id (red team 7 — its
    pseudonym, in ``subject_spend``, was this key)."""
    return hmac.new(ledger.subject_key(), _KEY_LABEL, hashlib.sha256).digest()


def issue_credential(key: bytes, token_id: str, issued_at: int | None = None) -> str:
    """The UI credential of token ``token_id``: ``<id>.<issued at, Unix seconds>.<MAC>``
    (nothing of the token's secret)."""
    at = int(time.time()) if issued_at is None else int(issued_at)
    msg = f"{token_id}.{at:010d}"
    mac = hmac.new(key, _MAC_LABEL + msg.encode("ascii"), hashlib.sha256).digest()
    return f"{msg}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode('ascii')}"


def credential_token_id(key: bytes, value: str, now: float | None = None) -> str | None:
    """The token id a UI credential names, if its MAC is ours and it was issued within the
    last :data:`UI_SESSION` seconds; else None (whether its token is still in force is
    :func:`privcal.storage.token_checks.active_token`'s to say)."""
    m = _CREDENTIAL.fullmatch(value.encode("ascii", "replace"))
    if m is None:
        return None
    tid, at = m.group(1).decode(), int(m.group(2))
    if not hmac.compare_digest(issue_credential(key, tid, at).encode(), m.group(0)):
        return None
    age = (time.time() if now is None else now) - at
    return tid if -60 <= age <= UI_SESSION else None  # a minute of clock skew between workers


def cookie_credential(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The first well-formed UI credential among the request's ``privcal_ui`` cookies, or
    None (:func:`cookie_credentials`)."""
    found = cookie_credentials(headers)
    return found[0] if found else None


def cookie_credentials(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """The well-formed UI credentials among the request's ``privcal_ui`` cookies, in order.
    Linear in the header: split on ``;`` and ``=``, no unquoting (a credential never needs
    quoting; see the module docstring); Cookie headers longer than
    :data:`COOKIE_HEADER_MAX` bytes in all count as absent. Each is tried in turn
    (:func:`ui_principal`): a ``privcal_ui`` cookie set for ``Path=/ui/`` by a page on another
    port or a sibling host — sent before the login's own, the longer path first — made the
    web view ask an auditor to log in again and again (red team 26, service F4)."""
    raw = [v for k, v in headers if k == b"cookie"]
    if not raw or sum(len(v) for v in raw) > COOKIE_HEADER_MAX:
        return []
    want = COOKIE.encode()
    out = []
    for header in raw:
        for part in header.split(b";"):
            name, eq, value = part.partition(b"=")
            if eq and name.strip() == want and _CREDENTIAL.fullmatch(value.strip()):
                out.append(value.strip().decode("ascii"))
    return out


def _key(app: Any) -> bytes:
    key = getattr(app.state, "ui_key", None)
    if key is None:
        key = app.state.ui_key = ui_key(app.state.accountant.ledger)
    return bytes(key)


def _session_token(app: Any, values: list[str]) -> TokenInfo | None:
    """The token of the first of ``values`` that this server issued (its MAC) for a token
    still in force; None if none is."""
    from privcal.storage.token_checks import active_token

    for value in values:
        tid = credential_token_id(_key(app), value)
        tok = None if tid is None else active_token(app.state.accountant.ledger, tid)
        if tok is not None:
            return tok
    return None


async def ui_principal(scope: Scope) -> TokenInfo | None:
    """The token record a ``/ui`` request's cookie stands for, if any (None: the page asks
    to log in; a ledger that cannot be read too: the page itself answers its state)."""
    import anyio

    values = cookie_credentials(scope["headers"])
    if not values:
        return None
    try:
        return await anyio.to_thread.run_sync(_session_token, scope["app"], values)
    except PrivcalError:
        return None


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


def cross_site(request: Request) -> bool:
    """Whether a browser says this request comes from another origin (a form on another
    page; red team 18: SameSite ignores the port, so a page on another port of this host
    could make a logged-in auditor's browser post /ui/verify — a full verification — at
    each load): ``Sec-Fetch-Site`` other than same-origin/none, or an ``Origin`` that is
    not this server. A client that sends neither (not a browser) carries no ambient cookie
    for anyone to abuse."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:  # every current browser sends it
        return site not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    # the host only: behind a proxy that terminates TLS the scheme seen here is http
    return urlsplit(origin).netloc != request.headers.get("host", "")


def _guard(request: Request) -> Response | None:
    if request.method == "POST" and cross_site(request):
        return _page("login.html", status=403,
                     error="this form was sent from another site: open the page here and "
                           "use its button")
    tok = _who(request)
    if tok is None:
        return RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
    if tok.role not in UI_ROLES:
        return _page("login.html", status=403,
                     error=f"{with_article(tok.role)} token cannot open the auditor's view")
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


def spent_percent(spent: Decimal, cap: Decimal) -> str:
    """The spent share of a cap in percent, one decimal, never shown smaller than it is nor
    as the whole cap while some of it remains (red team 23, newcomer F5: rounded to nearest,
    ρ = 0.0004 of 1 read "0.0%" and ε = 1.99995 of 2 "100.0%" beside 0.00005 left): rounded
    up, and ">99.9" below 100 %."""
    from decimal import ROUND_CEILING

    if not cap or spent <= 0:
        return "0"
    pct = (100 * Decimal(spent) / Decimal(cap)).quantize(Decimal("0.1"), rounding=ROUND_CEILING)
    if pct >= 100 and spent < cap:
        return ">99.9"
    return format(pct, "f")


@router.get("/login", openapi_extra={"x-privcal-roles": ["public"]})
def login_form() -> HTMLResponse:
    """The login form."""
    return _page("login.html")


@router.post("/login", openapi_extra={"x-privcal-roles": ["public"]})
def login(request: Request, token: str = Form(max_length=200)) -> Response:
    """Check the token and set an HttpOnly SameSite=Strict cookie holding a UI-only
    credential for it (:func:`issue_credential`: never the token, which opens ``/v1``). Not
    for a form sent from another site (:func:`cross_site`; red team 22, ui F2: a page
    elsewhere — another port of this host — posted its own auditor token and swapped a
    logged-in auditor's session for it), checked before the token is."""
    from privcal.storage.tokens import authenticate

    if cross_site(request):
        return _page("login.html", status=403,
                     error="this form was sent from another site: open the page here and "
                           "use its button")
    tok = authenticate(request.app.state.accountant.ledger, token.strip())
    if tok is None:
        return _page("login.html", status=401, error="invalid, expired or revoked token")
    if tok.role not in UI_ROLES:
        return _page("login.html", status=403,
                     error=f"{with_article(tok.role)} token cannot open the auditor's view")
    resp = RedirectResponse("/ui/", status_code=303, headers=_HEADERS)
    resp.set_cookie(COOKIE, issue_credential(_key(request.app), tok.id), httponly=True,
                    samesite="strict", path="/ui", secure=request.url.scheme == "https")
    return resp


@router.post("/logout", openapi_extra={"x-privcal-roles": ["public"]})
def logout(request: Request) -> Response:
    """Drop the cookie (not for a form sent from another site: :func:`cross_site`)."""
    if cross_site(request):
        return _page("login.html", status=403, error="this form was sent from another site")
    resp = RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def _overview(request: Request) -> dict[str, Any]:
    """What the page shows, spelled as ``privcal budget show`` and ``release list`` spell it
    (red team 22, ui F5: ``5E-7`` beside the CLI's ``0.0000005``, ``inf`` beside ``+inf``), with
    the per-subject local-DP spends, which the bars (the central cap) leave out."""
    from privcal.accountant.report import audit_report
    from privcal.costs import plain

    acct = request.app.state.accountant
    rows = []
    for d in acct.datasets():
        b = acct.budget(d.name)
        rep = audit_report(acct, d.name, realized=False)[0]  # the chart's points only
        points = [{"used_after": t.used_after} for t in rep.timeline]
        bars = []
        for k, cap in b.cap.items():
            spent = b.spent.get(k, Decimal(0))
            frac = float(spent / cap) if cap else 0.0
            left = b.remaining.get(k)
            bars.append({"key": k, "cap": plain(cap), "spent": plain(spent),
                         "remaining": "" if left is None else plain(left),
                         "pct": spent_percent(spent, cap), "w": round(300 * min(frac, 1.0), 1)})
        subjects = None
        if b.subject_epsilon is not None:
            sub = acct.subject_summary(d.name)
            subjects = (f"per-subject ε cap {plain(b.subject_epsilon)}: {sub.subjects} subjects "
                        f"charged, the largest spend {plain(sub.max)}, {sub.at_cap} at the cap")
        rows.append({"name": d.name, "policy": b.policy, "bars": bars,
                     "guarantee": b.guarantee.short, "subjects": subjects,
                     "spent_dp": f"ε={plain(b.spent_dp.epsilon)}, δ={plain(b.spent_dp.delta)}",
                     "charges": b.charges, "releases": b.releases,
                     "chart": spend_chart(points, b.cap)})
    rels = []
    for r in acct.releases():
        rels.append({"id": r.id, "dataset": r.dataset, "method": r.method,
                     "threshold": float_text(r.threshold),
                     "requester": r.requester or "",
                     "coverage": getattr(r.coverage, "statement", ""),
                     "assumes": r.assumes or "",
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
