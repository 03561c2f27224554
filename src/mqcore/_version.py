"""The single place the version is written (pyproject reads it; `mqcore --version` prints it)."""

__version__ = "0.1.0"
