"""What a frontend says about a capture: warnings, and notes that only inform."""

from __future__ import annotations


class Note(str):
    """A frontend message that informs rather than warns; the report lists it under ``notes``."""

    __slots__ = ()


def split_notes(messages: list[str]) -> tuple[list[str], list[str]]:
    """(warnings, notes) from a frontend's messages."""
    return [m for m in messages if not isinstance(m, Note)], [str(m) for m in messages if isinstance(m, Note)]
