"""Admin actions on users and keys (`sftq admin ...` and the dev stack's demo user).

Each action is one procedure call from db.py; the procedures decide and raise coded
errors, which come back here as typed errors (errors.from_db_error) with exit codes the
user CLI also uses, so scripts can tell "no such user" from "database down".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from sftq_server import db
from sftq_server.core.errors import BadRequest, Conflict, NotFound, SftqError, from_db_error

# Exit codes, the same numbers the user CLI gives the same kinds of failure.
EXIT_ERROR = 1
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5
EXIT_UNAVAILABLE = 6
EXIT_REJECTED = 7

# Whether a presented key belongs to an enabled user and is not revoked. Read-mostly: it is
# the same check every request makes. (Used by `sftq dev` to know whether the key kept in
# its env file still works against the database it is pointed at.)


class AdminError(Exception):
    """A failure with a message for stderr and the exit code that goes with it."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True)
class UserRow:
    name: str
    created_at: datetime
    disabled_at: datetime | None
    cap: int
    running: int
    queued: int
    active_keys: int
    last_used_at: datetime | None
    # The per-user limits in effect (0: none) and the ones set for this user alone; the
    # user's open streams and MCP waits.
    limits: Limits | None = None
    open_streams: int = 0

    def as_json(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return (
                None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")
            )

        return {
            "name": self.name,
            "created_at": iso(self.created_at),
            "disabled_at": iso(self.disabled_at),
            "cap": self.cap,
            "running": self.running,
            "queued": self.queued,
            "active_keys": self.active_keys,
            "last_used_at": iso(self.last_used_at),
            **(self.limits.as_json() if self.limits is not None else {}),
            "open_streams": self.open_streams,
        }


LIMIT_NAMES = ("rate_per_minute", "max_queued", "max_streams")


@dataclass(frozen=True)
class Limits:
    """A user's limits in effect (or the defaults'): 0 means no limit. `own`: the ones set
    for the user alone (the others follow the defaults)."""

    rate_per_minute: int
    max_queued: int
    max_streams: int
    own: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"rate_per_minute": self.rate_per_minute, "max_queued": self.max_queued,
                "max_streams": self.max_streams, "own_limits": list(self.own)}

    def describe(self) -> str:
        def one(name: str, value: int, unit: str, none: str) -> str:
            text = none if value == 0 else f"{value} {unit}"
            return text if name in self.own else f"{text} (default)"

        return ", ".join((
            one("rate_per_minute", self.rate_per_minute, "requests a minute", "no rate limit"),
            one("max_queued", self.max_queued, "queued jobs at most", "no queue limit"),
            one("max_streams", self.max_streams, "streams and waits at once",
                "no stream limit")))


# What `sftq admin set-limits` says of each limit: in its --help and in docs/cli.md.
LIMITS_HELP = (
    "Each limit is a whole number, 0 for no limit, or `default` to follow the deployment's "
    "default again. --rpm: requests a minute of POST /jobs, POST /jobs:validate, retries and "
    "MCP tool calls together (a burst of that many, refilled evenly; default 600); over it "
    "429 rate_limited. --max-queued: QUEUED jobs at once (default: no limit); over it 429 "
    "queue_limit. --max-streams: open SSE streams and MCP waits at once (default 10); over "
    "it 429 too_many_streams. They take effect at the user's next request."
)


def parse_limit(raw: str) -> int | None:
    """A limit from the command line: N (0: none) or `default` (None)."""
    if raw.strip().lower() == "default":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise AdminError(f"a limit is a whole number (0: no limit) or 'default', not {raw!r}",
                         EXIT_REJECTED) from None
    if value < 0:
        raise AdminError("a limit is 0 (no limit) or more", EXIT_REJECTED)
    return value


def set_limits(url: str, name: str | None, changes: dict[str, int | None]) -> Limits:
    """Set some of a user's limits (name None: the defaults'); answer what is in effect."""
    if not changes:
        raise AdminError("nothing to set: give --rpm, --max-queued or --max-streams",
                         EXIT_REJECTED)
    with connect(url) as conn, conn.transaction():
        conn.execute(db.SET_USER_LIMITS, (
            name, *(changes.get(k) for k in LIMIT_NAMES), *(k in changes for k in LIMIT_NAMES)))
        rows = conn.execute(db.LIST_USER_LIMITS).fetchall()
    return next(_limits(r)[1] for r in rows if r[0] == name)


def _limits(row: tuple[Any, ...]) -> tuple[str | None, Limits, int]:
    name, rpm, queued, streams, rpm_default, queued_default, streams_default, open_ = row
    own = tuple(k for k, default in zip(LIMIT_NAMES, (rpm_default, queued_default,
                                                      streams_default), strict=True)
                if not default)
    return name, Limits(int(rpm), int(queued), int(streams), own), int(open_ or 0)


def redact(url: str) -> str:
    """A database URL fit for an error message: the password replaced by ***."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def _exit_code(exc: SftqError) -> int:
    if isinstance(exc, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(exc, Conflict):
        return EXIT_CONFLICT
    if isinstance(exc, BadRequest):
        return EXIT_REJECTED
    return EXIT_ERROR


@contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection whose failures arrive as AdminError with a message a person can act on."""
    try:
        conn = psycopg.connect(url, connect_timeout=5, **db.connect_kwargs())
    except psycopg.OperationalError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise AdminError(
            f"cannot reach the database at {redact(url)}: {reason} "
            "(is `sftq dev` running, or is DATABASE_URL right?)",
            EXIT_UNAVAILABLE,
        ) from exc
    try:
        with conn:
            yield conn
    except psycopg.Error as exc:
        typed = from_db_error(exc)
        if typed is not None:
            raise AdminError(typed.message, _exit_code(typed)) from exc
        if isinstance(
            exc,
            psycopg.errors.UndefinedFunction
            | psycopg.errors.InvalidSchemaName
            | psycopg.errors.UndefinedTable,
        ):
            raise AdminError(
                "the database has no sftq schema yet: run `sftq db migrate` "
                f"against {redact(url)} first"
            ) from exc
        if isinstance(exc, psycopg.OperationalError):
            raise AdminError(
                f"lost the database at {redact(url)}: {exc}", EXIT_UNAVAILABLE
            ) from exc
        raise AdminError(f"database error: {exc}") from exc


def create_user(url: str, name: str, cap: int | None = None) -> None:
    with connect(url) as conn, conn.transaction():
        conn.execute(db.CREATE_USER, (name,))
        if cap is not None:
            conn.execute(db.SET_CAP, (name, cap))


def issue_key(url: str, name: str) -> tuple[str, str]:
    """A new key for the user: (key, prefix). The key cannot be read back later."""
    with connect(url) as conn:
        row = conn.execute(db.ISSUE_KEY, (name,)).fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


def revoke_key(url: str, prefix: str) -> None:
    with connect(url) as conn:
        conn.execute(db.REVOKE_KEY, (prefix,))


def set_cap(url: str, name: str, cap: int) -> None:
    with connect(url) as conn:
        conn.execute(db.SET_CAP, (name, cap))


@dataclass(frozen=True)
class UserStatus:
    running: int
    queued: int
    disabled_at: datetime | None
    changed: bool  # False when the user already was as asked


def set_disabled(url: str, name: str, disabled: bool) -> UserStatus:
    """Disable or re-enable a user; what their jobs now are (see DISABLE_HELP)."""
    with connect(url) as conn, conn.transaction():
        before = conn.execute(db.USER_STATUS, (name,)).fetchone()
        conn.execute(db.SET_USER_DISABLED, (name, disabled))  # SQ404 for an unknown user
        row = conn.execute(db.USER_STATUS, (name,)).fetchone()
    assert before is not None and row is not None
    return UserStatus(
        running=int(row[0]),
        queued=int(row[1]),
        disabled_at=row[2],
        changed=(before[2] is None) == disabled,
    )


# What disabling means for a user's jobs: said in `sftq admin disable-user --help` and docs/dev.md.
DISABLE_HELP = (
    "Their keys answer 401 on every route until enable-user (the keys are not revoked). Their "
    "QUEUED jobs stay queued but are not admitted, and do not hold up anyone else's; they keep "
    "their place in the FIFO order (by submission time), so after enable-user they go ahead of "
    "jobs submitted since. Their PROGRESS jobs keep running at Fireworks to the end and the "
    "scheduler records how they end as usual (still counted against the GPU budget). The "
    "user cannot cancel while disabled: cancel first if the jobs must stop."
)


def list_users(url: str) -> list[UserRow]:
    with connect(url) as conn:
        rows = conn.execute(db.LIST_USERS).fetchall()
        limits = {name: (lim, open_) for name, lim, open_ in
                  map(_limits, conn.execute(db.LIST_USER_LIMITS).fetchall())}
    return [
        UserRow(
            name=r[0],
            created_at=r[1],
            disabled_at=r[2],
            cap=int(r[3]),
            running=int(r[4]),
            queued=int(r[5]),
            active_keys=int(r[6]),
            last_used_at=r[7],
            limits=limits[r[0]][0] if r[0] in limits else None,
            open_streams=limits[r[0]][1] if r[0] in limits else 0,
        )
        for r in rows
    ]


def user_exists(url: str, name: str) -> bool:
    with connect(url) as conn:
        row = conn.execute(db.USER_EXISTS, (name,)).fetchone()
    return bool(row and row[0])


def key_is_active(url: str, key: str) -> bool:
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    with connect(url) as conn:
        row = conn.execute(db.KEY_IS_ACTIVE, (digest,)).fetchone()
    return bool(row and row[0])


def ensure_user_key(url: str, name: str, known_key: str | None) -> tuple[str, bool]:
    """A working key for `name`: known_key when it still works, else a fresh one (the user
    is created when missing). Returns (key, issued_now)."""
    if known_key and key_is_active(url, known_key):
        return known_key, False
    if not user_exists(url, name):
        try:
            create_user(url, name)
        except AdminError as exc:
            # Another process created it between the two calls; that is the outcome we wanted.
            if exc.exit_code != EXIT_CONFLICT:
                raise
    return issue_key(url, name)[0], True


def format_table(users: list[UserRow]) -> str:
    def when(value: datetime | None) -> str:
        return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")

    def limit(u: UserRow, name: str) -> str:
        # "-": no limit; "*": set for this user alone (else the deployment's default).
        if u.limits is None:
            return "?"
        value = getattr(u.limits, name)
        return ("-" if value == 0 else str(value)) + ("*" if name in u.limits.own else "")

    # The limits come last: the columns before them keep their places for readers of old.
    header = ("NAME", "CAP", "RUNNING", "QUEUED", "KEYS", "CREATED", "LAST USED", "DISABLED",
              "RPM", "MAX QUEUED", "STREAMS")
    rows = [
        (
            u.name,
            str(u.cap),
            str(u.running),
            str(u.queued),
            str(u.active_keys),
            when(u.created_at),
            when(u.last_used_at),
            when(u.disabled_at),
            limit(u, "rate_per_minute"),
            limit(u, "max_queued"),
            f"{u.open_streams}/{limit(u, 'max_streams')}",
        )
        for u in users
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
        for r in (header, *rows)
    )
