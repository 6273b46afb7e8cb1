"""ByteTable: the `struct.Struct` every on-disk module packs and unpacks its byte table with.

The same C struct, plus one thing: it pickles (as its format). The Spark reader ships the package
to its workers by value, and a module-level byte table — or a bound `unpack_from` of one, kept for
a hot loop — is part of what travels; a plain Struct refuses to be pickled.
"""

from __future__ import annotations

import struct


class ByteTable(struct.Struct):
    def __reduce__(self) -> tuple[type[ByteTable], tuple[str]]:
        return type(self), (self.format,)
