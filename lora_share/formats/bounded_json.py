"""JSON from a file made elsewhere, parsed only once its nesting depth is known to be bounded.

``json.loads`` recurses once per nested array or object, and so do the readers that turn the parsed
value into dataclasses: a document nested 100,000 deep ends in a ``RecursionError`` far from the
file that caused it. ``nesting_depth`` measures the depth without recursing (C-speed passes over
the bytes), so a deep document is refused by name before anything parses it.
"""

from __future__ import annotations

import json
import re

# Every writer lora-share reads nests far less (an ExportedProgram's JSON: 9 levels; a weights
# config: 6); 64 leaves room for nested graphs while keeping each reader's recursion shallow.
MAX_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_INNERMOST = re.compile(rb"\[\]|\{\}")


def nesting_depth(data: bytes, limit: int = MAX_DEPTH) -> int | None:
    """How deep ``data``'s arrays and objects nest; ``None`` when deeper than ``limit``.

    The brackets outside strings are kept, then each pass removes the innermost pairs: the number
    of passes is the depth. Unbalanced brackets stop the count early (json.loads then says where).
    """
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKET)
    depth = 0
    while brackets:
        if depth == limit:
            return None
        shorter = _INNERMOST.sub(b"", brackets)
        if len(shorter) == len(brackets):
            break
        brackets, depth = shorter, depth + 1
    return depth


def loads(data: bytes, limit: int = MAX_DEPTH):
    """``data`` parsed; ValueError (with a short reason) if it is not JSON or nests deeper than ``limit``."""
    if nesting_depth(data, limit) is None:
        raise ValueError(f"nested deeper than {limit} levels, which no writer produces")
    try:
        return json.loads(data)
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
