"""What the `mqcore` commands add to an error so the next try works: "did you mean" for a
mistyped option, topic or property, and who holds a store's writer lock and what to do then.

`did_you_mean(word, choices)` is the one suggestion every command uses (cli/__init__.py for
options and topics; a query's note on a selector property no message had).
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable

import mqcore
from mqcore.errors import MQCoreError
from mqcore.log.internal import is_internal
from mqcore.storage.logdir import LogDirectory

# an option typed too short or with a letter off: "--fro" -> "--from" (difflib's ratio 0.55)
CUTOFF = 0.6
PROPERTY_SAMPLE = 1000  # messages read from the start of each partition for properties_seen


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """ "did you mean 'orders'?": the choices `word` is a prefix of, else the closest one by
    difflib; "" when none is close."""
    pool = sorted(set(choices))
    close = [c for c in pool if c.startswith(word) and c != word] if word else []
    if not close:
        close = difflib.get_close_matches(word, pool, n=1, cutoff=CUTOFF)
    if not close:
        return ""
    return "did you mean " + " or ".join(repr(c) if c[:1] != "-" else c for c in close) + "?"


def option_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of `parser`, from the option lines of its help (argparse has no
    public list of them)."""
    names: list[str] = []
    for line in parser.format_help().splitlines():
        invocation = _OPTION_LINE.match(line)
        if invocation is not None:
            names += _OPTION.findall(invocation.group(1))
    return names


_OPTION_LINE = re.compile(r"  (-\S.*?)(?:  |$)")  # "  -p PARTITION, --partition PARTITION"
_OPTION = re.compile(r"(?<![\w-])--?[A-Za-z0-9][\w-]*")


def option_hint(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """The "did you mean" line for the unknown options among `extras` ("--fro" -> --from)."""
    known = option_names(parser)
    for arg in extras:
        if arg.startswith("-") and len(arg) > 1:
            hint = did_you_mean(arg.split("=", 1)[0], known)
            if hint:
                return f"{arg}: {hint}"
    return ""


def topic_hint(args: argparse.Namespace) -> str:
    """For an UnknownTopicError: the store's topics close to the one(s) the command named
    ("" when none is close or the store cannot be read)."""
    named = [args.topic] if isinstance(getattr(args, "topic", None), str) else []
    named += list(getattr(args, "topics", None) or [])
    try:
        topics = set(LogDirectory(args.store, writable=False).load_topics())
    except (MQCoreError, OSError, ValueError, AttributeError):
        return ""
    for name in named:
        if name not in topics:
            pool = topics if is_internal(name) else {t for t in topics if not is_internal(t)}
            hint = did_you_mean(name, pool)
            if hint:
                return hint
    return ""


def properties_seen(
    store: mqcore.Store, topics: Iterable[str], sample: int = PROPERTY_SAMPLE
) -> list[str]:
    """The property names the first `sample` messages of each partition of `topics` carry,
    sorted: what a selector naming a property no message has could have meant."""
    names: set[str] = set()
    for topic in topics:
        for p in store.available_partitions(topic):
            start = store.start_offset(topic, p)
            for m in store.read(topic, p, start, sample):
                names.update(m.properties)
    return sorted(names)


def property_hint(name: str, seen: list[str]) -> str:
    """What to add to "no scanned message has property 'levle'": the closest name seen, and
    the names seen."""
    if not seen:
        return "no message read has any property"
    close = did_you_mean(name, seen)
    listed = ", ".join(seen[:20]) + (f" and {len(seen) - 20} more" if len(seen) > 20 else "")
    return f"{close + ' ' if close else ''}(properties seen: {listed})"


_SERVE = re.compile(r"mqcore serve on (\S+)")


def lock_advice(holder: str, topic: str) -> str:
    """What to do when `produce` finds the writer lock held by `holder` (the text
    StoreLockedError.holder gives: "mqcore serve on 127.0.0.1:9092, pid 123")."""
    served = _SERVE.search(holder)
    if served is not None:
        address = served.group(1).rstrip(",")
        return (
            f"produce through it with a Kafka client (kcat -P -b {address} -t {topic}), or "
            "stop it and run this again"
        )
    return "stop that process and run this again, or append from it"
