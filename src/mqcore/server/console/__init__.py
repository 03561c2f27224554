"""The operations console (docs/console.md): HTML pages under /ui on the same Starlette app
as the JSON API (server/http.py create_app), Jinja2 templates with autoescape on, and a small
plain script (static/console.js) that loads the browser's rows in chunks.

Pages: overview, message browser, lookup, message detail, groups; write actions (produce,
reset a group's offsets, resend a dead-lettered message) only with allow_write.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from starlette.responses import RedirectResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mqcore.server.console import actions, browse, views

STATIC = os.path.join(os.path.dirname(__file__), "static")


def console_routes() -> list[Any]:
    """The console's routes (pages, the rows endpoint, static files, write actions), and `/`
    redirecting to /ui/."""
    page = views.html_page
    return [
        Route("/", lambda request: RedirectResponse("/ui/", status_code=307)),
        Route("/ui", lambda request: RedirectResponse("/ui/", status_code=307)),
        Route("/ui/", page(views.overview)),
        Route("/ui/topics/{topic}", page(views.browser, browse.PAGE_FIELDS)),
        Route("/ui/topics/{topic}/rows", views.rows),
        Route(
            "/ui/topics/{topic}/partitions/{partition}/offsets/{offset}",
            page(views.message, ("format", "tz")),
        ),
        Route("/ui/lookup", page(views.lookup, ("q", "topic", "isolation_level"))),
        Route("/ui/groups", page(views.groups)),
        Route("/ui/groups/{group}", page(views.groups)),
        Route("/ui/actions/produce", actions.action(actions.produce), methods=["POST"]),
        Route("/ui/actions/reset-offsets", actions.action(actions.reset_offsets), methods=["POST"]),
        Route("/ui/actions/resend", actions.action(actions.resend), methods=["POST"]),
        Mount("/ui/static", StaticFiles(directory=STATIC), name="static"),
        Route("/ui/{rest:path}", views.not_found),
    ]


def configure(state: Any, allow_write: bool) -> None:
    """The app state the console reads: whether writes are on, and the key of its forms'
    CSRF tokens (random per app; csrf.py)."""
    state.console_allow_write = allow_write
    state.console_key = secrets.token_bytes(32)
