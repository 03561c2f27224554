"""Failed logins back off, per peer and per user (docs/server.md "Security").

Without it a client could check passwords as fast as PBKDF2 allows (738 wrong HTTP Basic
passwords in 5 s from one loop). `LoginBackoff` counts failures and says how long a peer, or
anyone trying a user name, must wait before its next attempt is even checked. It knows nothing
of HTTP or SASL: the HTTP server (httpauth.py) answers a waiting request 429 without paying
PBKDF2, and the Kafka listener can refuse a SASL exchange the same way.

The balance between stopping a guesser and letting one lock a user out:

- per peer (an IP address; an IPv6 peer by its /64, which one host usually has whole): strict.
  PEER_FREE failures in a row may come at once; after that each attempt waits, 1 s after the
  last failure, doubling with each further failure up to PEER_CAP. One client guessing gets
  about a guess a minute once it is in.
- per user name, counted over every peer: gentle. USER_FREE failures, then 1 s doubling up to
  USER_CAP only. Guessers spread over many addresses get one guess per USER_CAP for a name;
  a lockout someone else causes costs the real user at most USER_CAP per attempt, and
  nothing from a peer that has logged in as that user before (`succeeded` remembers the
  pair), so a user's own machine is never locked out by strangers.
- failures are forgotten FORGET seconds after the last one; a success forgets its peer's.
- memory is bounded: at most `max_keys` peers, users and remembered pairs each, the least
  recently touched evicted first.

A lockout (the failure that uses up the free ones) is logged once as a warning, at most one line
per `log_interval` seconds (the lines held back are counted in the next one).
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

PEER_FREE = 5  # failures a peer may make at once; after them it waits
PEER_CAP = 60.0  # seconds a peer waits at most between attempts
USER_FREE = 10  # failures at one user name (from any peer) before its attempts wait
USER_CAP = 10.0  # seconds: gentle, so a user locked out by others waits little
FIRST_WAIT = 1.0  # seconds after the first failure past the free ones, doubling from there
FORGET = 900.0  # seconds without a failure after which a key starts afresh
MAX_KEYS = 10_000  # peers, users and remembered (peer, user) pairs kept, each
LOG_INTERVAL = 10.0  # seconds between two lockout warnings


@dataclass(slots=True)
class _Strikes:
    """One key's failures: how many, when the last was, and until when it must wait."""

    failures: int = 0
    last: float = 0.0
    until: float = 0.0


@dataclass(frozen=True, slots=True)
class _Rule:
    free: int
    cap: float


class LoginBackoff:
    """How long a login attempt must wait, from the failures before it. `wait(peer, user)`:
    seconds still to wait (0: it may be checked); then `failed(peer, user)` or
    `succeeded(peer, user)` with its outcome. `clock` is monotonic seconds (a fake in tests).
    Thread-safe."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        peer_free: int = PEER_FREE,
        peer_cap: float = PEER_CAP,
        user_free: int = USER_FREE,
        user_cap: float = USER_CAP,
        first_wait: float = FIRST_WAIT,
        forget: float = FORGET,
        max_keys: int = MAX_KEYS,
        logger: logging.Logger | None = None,
        log_interval: float = LOG_INTERVAL,
    ):
        self.clock = clock
        self.peer_rule, self.user_rule = _Rule(peer_free, peer_cap), _Rule(user_free, user_cap)
        self.first_wait, self.forget, self.max_keys = first_wait, forget, max_keys
        self.log, self.log_interval = logger, log_interval
        self.lockouts = 0  # lockouts begun (peer or user), for the log and for tests
        self._peers: OrderedDict[str, _Strikes] = OrderedDict()
        self._users: OrderedDict[str, _Strikes] = OrderedDict()
        self._trusted: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self._next_log = -float("inf")
        self._held_back = 0

    def wait(self, peer: str, user: str) -> float:
        """Seconds before an attempt from `peer` as `user` may be checked (0: now)."""
        now = self.clock()
        with self._lock:
            left = self._left(self._peers.get(peer), now)
            if (peer, user) not in self._trusted:
                left = max(left, self._left(self._users.get(user), now))
        return left

    def failed(self, peer: str, user: str) -> float:
        """Count a failed attempt; returns the wait it earned (0: still free)."""
        now = self.clock()
        with self._lock:
            peer_began = self._strike(self._peers, peer, self.peer_rule, now)
            user_began = self._strike(self._users, user, self.user_rule, now)
            began = [what for what, b in (("peer", peer_began), ("user", user_began)) if b]
            left = self._left(self._peers[peer], now)
            if (peer, user) not in self._trusted:
                left = max(left, self._left(self._users[user], now))
        for what in began:
            self._lockout(what, peer, user, now)
        return left

    def succeeded(self, peer: str, user: str) -> None:
        """A valid login: the peer's failures are forgotten and the pair is remembered, so
        the user's own backoff (others guessing at the name) no longer slows this peer."""
        with self._lock:
            self._peers.pop(peer, None)
            self._trusted[(peer, user)] = None
            self._trusted.move_to_end((peer, user))
            while len(self._trusted) > self.max_keys:
                self._trusted.popitem(last=False)

    def tracked(self) -> tuple[int, int, int]:
        """How many peers, user names and (peer, user) pairs are kept (each <= max_keys)."""
        with self._lock:
            return len(self._peers), len(self._users), len(self._trusted)

    def _left(self, strikes: _Strikes | None, now: float) -> float:
        if strikes is None or now - strikes.last > self.forget:
            return 0.0
        return max(0.0, strikes.until - now)

    def _strike(self, table: OrderedDict[str, _Strikes], key: str, rule: _Rule, now: float) -> bool:
        """One more failure for `key`; True when it begins a lockout."""
        strikes = table.get(key)
        if strikes is None or now - strikes.last > self.forget:
            strikes = table[key] = _Strikes()
        table.move_to_end(key)
        while len(table) > self.max_keys:
            table.popitem(last=False)
        strikes.failures += 1
        strikes.last = now
        over = strikes.failures - rule.free
        if over < 0:
            return False
        wait = min(rule.cap, self.first_wait * 2 ** min(over, 32))
        strikes.until = max(strikes.until, now + wait)
        return over == 0

    def _lockout(self, what: str, peer: str, user: str, now: float) -> None:
        """Log a lockout once, at most one line per log_interval (the rest counted)."""
        with self._lock:
            self.lockouts += 1
            if now < self._next_log:
                self._held_back += 1
                return
            held, self._held_back = self._held_back, 0
            self._next_log = now + self.log_interval
        if self.log is None:
            return
        if what == "peer":
            rule, whom = self.peer_rule, f"from {peer} (last as {user[:64]!r})"
        else:
            rule, whom = self.user_rule, f"as {user[:64]!r} (last from {peer})"
        more = f"; {held} more lockouts since the last line" if held else ""
        self.log.warning(
            "%d failed logins %s: its attempts wait from now on, up to %g s each%s",
            rule.free, whom, rule.cap, more,
        )  # fmt: skip


def peer_key(host: str | None) -> str:
    """The key a client's address is counted under: an IPv4 address as it is, an IPv6 one by
    its /64 (one host usually has a whole /64, so counting addresses would count nothing),
    an IPv4-mapped IPv6 address as the IPv4 one; "" for no address (a Unix socket)."""
    if not host:
        return ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
