"""The CSRF token of the console's write forms, bound to the browser session and to the
principal: HMAC(the app's random key, principal NUL session), where the session is a random
cookie (`mqcore_console`: HttpOnly, SameSite=Strict, Secure over HTTPS) the console sets on
the first page it answers. A page of another site cannot read the token; a token a page got
hold of anyway serves neither another browser (its cookie differs) nor, with authentication,
another user (the principal differs)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "mqcore_console"


def session_of(request: Request) -> str:
    """The browser session: its cookie, or a new one the page's response sets (`attach`)."""
    session = request.cookies.get(COOKIE, "")
    if len(session) >= 16:
        return session
    made = getattr(request.state, "new_console_session", None)
    if made is None:
        made = request.state.new_console_session = secrets.token_urlsafe(24)
    return made


def token(request: Request) -> str:
    """The token the request's page puts in its forms."""
    key: bytes = request.app.state.console_key
    principal = getattr(request.state, "principal", None) or ""
    mac = hmac.new(key, f"{principal}\0{session_of(request)}".encode(), hashlib.sha256)
    return base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def valid(request: Request, given: str | None) -> bool:
    """Whether a form's token is this browser session's and this principal's."""
    if len(request.cookies.get(COOKIE, "")) < 16:
        return False
    return hmac.compare_digest(given or "", token(request))


def attach(request: Request, response: Response) -> None:
    """Set the session cookie when the page made a new one."""
    session = getattr(request.state, "new_console_session", None)
    if session is not None:
        response.set_cookie(
            COOKIE, session, path="/ui", httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )  # fmt: skip
