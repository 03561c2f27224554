"""The crash-child harness itself (tests/crashchild.py): what a killed child printed is all
returned, and a child that does not die as the test expected fails the test."""

from __future__ import annotations

import pytest
from crashchild import KILLED, run_child

# prints 2000 numbered lines in one write, then waits for the kill on its stdin
CHATTY = """
import os, sys
os.write(1, b"".join(b"%d\\n" % i for i in range(2000)))
sys.stdin.read()
"""


def test_lines_printed_before_the_kill_are_all_returned() -> None:
    """The parent stops reading after the first line and kills: the other 1999 lines, already
    in the pipe (partly inside readline's buffer), were acknowledged and must be returned."""
    child = run_child(CHATTY, kill_when=lambda lines: len(lines) >= 1)
    assert child.returncode == KILLED
    assert child.lines == [str(i) for i in range(2000)]


def test_a_child_that_is_not_killed_at_its_crash_point_fails() -> None:
    with pytest.raises(AssertionError):
        run_child("import mqcore\n", crash_at="append.after_write")  # never appends: exit 0


def test_a_cut_last_line_is_dropped() -> None:
    child = run_child("import os\nos.write(1, b'a\\nb\\nhal')\n")
    assert (child.out, child.lines) == ("a\nb\nhal", ["a", "b"])
