"""Keys whose first key's `__hash__` empties their list: a compiled batch function that hashes a
list's keys one by one must not read past the list's end once it is shorter
(tests/storage/test_keyfilter.py, tests/storage/test_overlay.py)."""

from __future__ import annotations

from typing import Any


def refill(keys: list[Any]) -> list[Any]:
    """Make `keys` [a key that clears `keys` when hashed, "a", "b"]; returns it."""

    class Shrinks:
        def __hash__(self) -> int:
            keys.clear()
            return 7

    keys[:] = [Shrinks(), "a", "b"]
    return keys
