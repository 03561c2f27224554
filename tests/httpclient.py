"""A browser-like HTTP client for the tests of the HTTP API and the console: real requests over
http.client, with Basic credentials, the cookies the server set, the Origin a browser sends
with a POST, and any header forged (Host, Origin) as a hostile page's browser would send it."""

from __future__ import annotations

import base64
import http.client
import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    status: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.text)

    @property
    def error(self) -> str | None:
        """The JSON error's name, or None for an answer that is not one."""
        try:
            doc = self.json()
        except ValueError:
            return None
        return doc.get("error") if isinstance(doc, dict) else None


class Client:
    """One user of one server (`url`: scheme://host:port). It keeps the cookies the server
    sets, as a browser does; `origin` is sent with every POST and DELETE unless None."""

    def __init__(self, url: str, user: str | None = None, password: str | None = None):
        self.url = url
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port = parsed.hostname or "", parsed.port or 80
        self.origin: str | None = url
        self.cookies: dict[str, str] = {}
        self.auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            self.auth = f"Basic {token}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> Answer:
        sent = {"Connection": "close"}
        if self.auth:
            sent["Authorization"] = self.auth
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if method in ("POST", "DELETE") and self.origin is not None:
            sent["Origin"] = self.origin
        sent.update(headers or {})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=sent)
            r = conn.getresponse()
            text = r.read().decode("utf-8", "replace")
            for value in r.headers.get_all("Set-Cookie") or []:
                name, _, rest = value.partition("=")
                self.cookies[name.strip()] = rest.split(";", 1)[0]
            return Answer(r.status, text, {k.lower(): v for k, v in r.getheaders()})
        finally:
            conn.close()

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, headers=headers)

    def post_form(self, path: str, fields: dict[str, str], **headers: str) -> Answer:
        body = urllib.parse.urlencode(fields).encode()
        return self.request(
            "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded", **headers}
        )

    def form_token(self, page: str = "/ui/") -> str:
        """The CSRF token of the write forms on `page` (fetched as this user, which also
        takes the session cookie the server sets)."""
        answer = self.get(page)
        m = re.search(r'name="csrf" value="([^"]+)"', answer.text)
        assert m, f"no write form on {page}: {answer.status} {answer.text[:300]}"
        return m[1]

    def submit(self, path: str, fields: dict[str, str], page: str = "/ui/") -> Answer:
        """A console write action as its form sends it: this user's token, cookie, Origin."""
        return self.post_form(path, {"csrf": self.form_token(page), **fields})
