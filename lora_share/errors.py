"""User-facing errors: one message naming the file, the key and what to do."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input. The CLI prints it on one line and exits 2."""

    exit_code = 2


class ConfigErrors(UserError):
    """Every problem found in one config file, reported together."""

    def __init__(self, path, problems: list[str]):
        self.path = path
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} error(s)\n{lines}")


def clip(text, limit: int = 80) -> str:
    """``text`` for a message: at most about ``limit`` characters, with the length of what was cut
    (a key name of megabytes from a hostile file must not become megabytes of stderr)."""
    text = str(text)
    return text if len(text) <= limit else f"{text[: max(limit - 24, 8)]}... ({len(text):,} characters)"
