"""One-dimensional PostgreSQL arrays in the binary wire format, packed here for the group
commit's batch (db.API_SUBMIT_MANY takes its seven columns as seven arrays).

Why not psycopg's own list dumper: it is generic, so for every list it walks the elements to
find their Python type, picks a dumper for that type and then for the array, per call. For a
batch of eight enqueues that was about three quarters of the client's time to send the
statement (about 100 of 130 us on the bench machine), all of it holding the interpreter lock
that the process's other requests wait for. Here the element types are known in advance, so
an array is a header and, per element, its length and bytes (PostgreSQL's array_recv):
the same values reach the server, in the same format, as psycopg would have sent.

A value is a `bytes` subclass per array type; the dumpers registered below (binary format,
the array type's OID) pass it through as it is. Use them with `%b` placeholders.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import TypeVar

import psycopg
from psycopg import pq
from psycopg.adapt import Dumper

_HEADER = struct.Struct("!iiiii")  # ndim 1, has-nulls flag, element OID, length, lower bound 1
_EMPTY = struct.Struct("!iii")  # ndim 0, flags, element OID
_INT4 = struct.Struct("!i")  # an element's length, or an int4 element
_NULL = _INT4.pack(-1)


class PackedArray(bytes):
    """An array already in PostgreSQL's binary format; subclasses name its type."""

    __slots__ = ()
    oid = 0  # the array type
    element_oid = 0


class ByteaArray(PackedArray):
    __slots__ = ()
    oid, element_oid = 1001, 17


class TextArray(PackedArray):
    __slots__ = ()
    oid, element_oid = 1009, 25


class Int4Array(PackedArray):
    __slots__ = ()
    oid, element_oid = 1007, 23


class JsonbArray(PackedArray):
    __slots__ = ()
    oid, element_oid = 3807, 3802


A = TypeVar("A", bound=PackedArray)


def _pack(cls: type[A], elements: list[bytes | None]) -> A:
    if not elements:
        return cls(_EMPTY.pack(0, 0, cls.element_oid))
    parts = [_HEADER.pack(1, 1, cls.element_oid, len(elements), 1)]
    for e in elements:
        if e is None:
            parts.append(_NULL)
        else:
            parts.append(_INT4.pack(len(e)))
            parts.append(e)
    return cls(b"".join(parts))


def bytea_array(values: Iterable[bytes | None]) -> ByteaArray:
    return _pack(ByteaArray, list(values))


def text_array(values: Iterable[str | None]) -> TextArray:
    return _pack(TextArray, [None if v is None else v.encode() for v in values])


def jsonb_array(values: Iterable[str | None]) -> JsonbArray:
    """JSON texts as jsonb (PostgreSQL parses them; format version 1 before each)."""
    return _pack(JsonbArray, [None if v is None else b"\x01" + v.encode() for v in values])


def int4_array(values: Iterable[int | None]) -> Int4Array:
    return _pack(Int4Array, [None if v is None else _INT4.pack(v) for v in values])


def array_length(value: PackedArray) -> int:
    """How many elements a packed array holds (0 for an empty one)."""
    ndim = _INT4.unpack_from(value, 0)[0]
    return _INT4.unpack_from(value, 12)[0] if ndim else 0


class _PassThrough(Dumper):
    format = pq.Format.BINARY

    def dump(self, obj: PackedArray) -> bytes:
        return obj


def _register() -> None:
    for cls in (ByteaArray, TextArray, Int4Array, JsonbArray):
        dumper = type(f"{cls.__name__}Dumper", (_PassThrough,), {"oid": cls.oid})
        psycopg.adapters.register_dumper(cls, dumper)


# Before any connection exists: db.py imports this module, and connections copy the global
# adapters when they are made.
_register()
