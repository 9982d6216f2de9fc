"""One-line error text, for logs, ``/readyz``, admission messages and CLI errors alike.

Exception messages from YAML parsers, TLS and HTTP clients span lines and can be huge (a parser
echoes the input it choked on); every surface ix-gpu writes to wants one bounded line. It lives in
the lowest layer that needs it (the config loader's errors), so that every layer above uses this
one function.
"""

from __future__ import annotations

DEFAULT_LIMIT = 500
"""Characters kept: enough for a field path and a reason, not enough to echo a hostile input."""


def one_line(error: BaseException | str, limit: int = DEFAULT_LIMIT) -> str:
    """Whitespace collapsed, cut to ``limit`` characters (marked with an ellipsis); an exception
    without a message is named by its type."""
    text = error if isinstance(error, str) else str(error)
    # Cut before splitting: splitting a megabyte message just to drop most of it is wasted work.
    flat = " ".join(text[: limit * 4].split())
    if not flat and isinstance(error, BaseException):
        return type(error).__name__
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def shown(value: object, limit: int = 64) -> str:
    """A user's value quoted in a message: bounded, and never a walk of its structure (``repr`` of
    a value nested a thousand deep raises RecursionError; of a megabyte string, costs a megabyte)."""
    if isinstance(value, str):
        return repr(value if len(value) <= limit else value[: limit - 1] + "…")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else "a very large number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"
