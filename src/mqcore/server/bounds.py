"""What the Kafka listener and the HTTP listener share of their bounds: the checks of a bound's
value, and the process's budget of file descriptors.

Every connection is a descriptor, and so is each partition's active segment: connections that
took them all would leave the store unable to open a segment (a CreateTopics of 30,000
partitions and a flood of connections both ran the process out of them). So the open-files
soft limit is raised to the hard one at start, the store keeps a descriptor for each partition
it may hold (its `max_partitions`, half the limit by default), FD_RESERVE more are kept for
indexes being opened, segments being read and the like, and the listeners share what is left:
a quarter for the HTTP listener, the rest for the Kafka listener. A bound cut to fit is
logged.
"""

from __future__ import annotations

import contextlib
import logging
import math
import resource

from mqcore.errors import InvalidConfigError

log = logging.getLogger("mqcore.server")

FD_RESERVE = 256  # descriptors kept besides the store's partitions
MIN_CONNECTIONS = 16  # what a cut leaves a listener at least


def check_counts(named: str = "", **values: object) -> None:
    """InvalidConfigError naming (after the prefix `named`) a count that is not a whole
    number >= 1."""
    for name, value in values.items():
        if type(value) is not int or value < 1:
            raise InvalidConfigError(f"{named}{name}={value!r}: a whole number >= 1")


def check_seconds(named: str = "", **values: object) -> None:
    """InvalidConfigError naming a time that is not a finite number of seconds > 0."""
    for name, value in values.items():
        fine = (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and value > 0
            and math.isfinite(value)
        )
        if not fine:
            raise InvalidConfigError(f"{named}{name}={value!r}: seconds > 0")


def raise_open_files_limit() -> int | None:
    """Lift the soft limit of open files to the hard one, as a broker's `ulimit -n` is raised.
    Returns the soft limit now (None: unlimited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return None if soft == resource.RLIM_INFINITY else soft


def connection_room(kept: int | None = None) -> int | None:
    """Descriptors the listeners may hold together: the soft open-files limit minus `kept`
    for the store (default half the limit, the store's default partition bound) and
    FD_RESERVE. None: no limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - (soft // 2 if kept is None else kept) - FD_RESERVE


def within(wanted: int, room: int | None, what: str) -> int:
    """`wanted`, or `room` (at least MIN_CONNECTIONS) when that is less, with a warning naming
    `what` was cut."""
    if room is None or wanted <= room:
        return wanted
    cut = max(room, MIN_CONNECTIONS)
    log.warning("%s %d cut to %d: the open-files limit (ulimit -n) leaves no more beside the "
                "store's descriptors", what, wanted, cut)  # fmt: skip
    return cut


def split_room(store_fds: int, http_wanted: int | None, kafka_wanted: int) -> tuple[int, int]:
    """(HTTP, Kafka) bounds on connections for `mqcore serve`: a quarter of the room left
    beside the store's `store_fds` for the HTTP listener (none without one), the rest for the
    Kafka listener."""
    room = connection_room(store_fds)
    http = 0
    if http_wanted is not None:
        http = within(http_wanted, None if room is None else room // 4, "HTTP max_connections")
    kafka = within(kafka_wanted, None if room is None else room - http, "max_connections")
    return http, kafka


__all__ = [
    "FD_RESERVE",
    "MIN_CONNECTIONS",
    "check_counts",
    "check_seconds",
    "connection_room",
    "raise_open_files_limit",
    "split_room",
    "within",
]
