"""Traces: the jobs a replay submits, read from and written to CSV or JSON lines.

One job a line: when it is submitted (`submit_at`, seconds from the start or an ISO 8601
time), by whom (`user`), its `kind` (SFT, DPO, RFT), `gpu_count`, how long it runs once
admitted (`run_seconds`), and optionally how it ends (`outcome`, `outcome_at`), which jobs of
the trace it runs after (`after`) and its own `id`. GPUs used outside the queue are rows of
`kind` EXTERNAL whose `gpu_count` is the GPUs in use from their `submit_at` on (docs/simulate.md).

A user's bad file never becomes a traceback: every problem is a `TraceError` that names the
file, the line, the column and what to write instead.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KINDS = ("SFT", "DPO", "RFT")
EXTERNAL = "EXTERNAL"
OUTCOMES = ("SUCCESS", "FAIL", "CANCELLED")
COLUMNS = ("id", "submit_at", "user", "kind", "gpu_count", "run_seconds", "outcome",
           "outcome_at", "after")
REQUIRED = ("submit_at", "user", "kind", "gpu_count", "run_seconds")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# The most jobs one job may run after (POST /jobs' `after`).
MAX_AFTER = 20
# The queue's own rule for a user's name (sftq.users.name).
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True)
class TraceJob:
    id: str  # the trace's own id of the job (a column `id`; line number "L<n>" if absent)
    submit_at: float  # seconds from the trace's start
    user: str
    kind: str  # SFT | DPO | RFT
    gpu_count: int
    run_seconds: float  # how long it runs at the provider once admitted
    outcome: str = "SUCCESS"  # "SUCCESS" | "FAIL" | "CANCELLED"
    # For CANCELLED/FAIL: seconds after submit_at when it happens (None: at the end of its run).
    outcome_at: float | None = None
    after: tuple[str, ...] = ()  # ids of trace jobs this one runs after


@dataclass(frozen=True)
class ExternalUsage:
    at: float  # seconds from the start
    gpus: int  # GPUs used outside the queue from then on


@dataclass(frozen=True)
class Trace:
    jobs: tuple[TraceJob, ...]  # sorted by submit_at, then file order
    external: tuple[ExternalUsage, ...] = ()  # sorted by at, then file order


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message says where and what to fix."""

    def __init__(self, path: str | Path, message: str, *, line: int | None = None,
                 column: str | None = None) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        where = self.path if line is None else f"{self.path}, line {line}"
        if column is not None:
            where += f", column {column!r}"
        super().__init__(f"{where}: {message}")


# -- reading ------------------------------------------------------------------------------
@dataclass
class _Row:
    line: int
    values: dict[str, Any]  # column -> raw value (str from CSV; any JSON value from JSONL)


def load_trace(path: str | Path, *, start: datetime | None = None) -> Trace:
    """Read a trace from CSV or JSON lines (by the file's extension, else by its first line).

    ISO 8601 times become seconds after `start` (naive times are UTC); without `start`, the
    earliest row of the file is time 0. Raises `TraceError` for anything that cannot be
    replayed, naming the line and the column.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                               "save it as UTF-8 CSV or JSON lines") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read: {exc.strerror or exc}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise TraceError(path, "is empty; a trace needs a header line and one line per job "
                               "(docs/simulate.md)")
    if _is_jsonl(path, lines[0][1]):
        rows = list(_jsonl_rows(path, lines))
    else:
        rows = list(_csv_rows(path, lines))
    return _build(path, rows, start)


def _is_jsonl(path: Path, first: str) -> bool:
    if path.suffix.lower() in JSONL_SUFFIXES:
        return True
    if path.suffix.lower() == ".csv":
        return False
    return first.lstrip().startswith("{")


def _csv_rows(path: Path, lines: list[tuple[int, str]]) -> Iterator[_Row]:
    header_line, header_text = lines[0]
    header = [name.strip().lower() for name in _csv_fields(path, header_line, header_text)]
    for name in header:
        if name not in COLUMNS:
            raise TraceError(path, f"unknown column {name!r} in the header; the columns are "
                                   f"{', '.join(COLUMNS)}", line=header_line)
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise TraceError(path, f"column {name!r} appears twice in the header",
                             line=header_line)
        seen.add(name)
    missing = [name for name in REQUIRED if name not in header]
    if missing:
        raise TraceError(path, f"the header lacks {', '.join(missing)}; it needs at least "
                               f"{', '.join(REQUIRED)} (the first line that is not a comment "
                               "is the header)", line=header_line)
    for number, text in lines[1:]:
        fields = _csv_fields(path, number, text)
        if len(fields) != len(header):
            raise TraceError(path, f"has {len(fields)} fields where the header has "
                                   f"{len(header)} ({', '.join(header)})", line=number)
        yield _Row(number, {name: value.strip() for name, value in zip(header, fields,
                                                                       strict=True)
                            if value.strip() != ""})


def _csv_fields(path: Path, number: int, text: str) -> list[str]:
    try:
        return next(csv.reader(io.StringIO(text), strict=True))
    except csv.Error as exc:
        raise TraceError(path, f"is not a CSV line ({exc}); quote a field that holds a "
                               "comma with double quotes", line=number) from None


def _jsonl_rows(path: Path, lines: list[tuple[int, str]]) -> Iterator[_Row]:
    for number, text in lines:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(path, f"is not JSON at character {exc.colno} ({exc.msg}); "
                                   "write one JSON object a line", line=number) from None
        if not isinstance(value, dict):
            raise TraceError(path, f"is a JSON {type(value).__name__}, not an object; write "
                                   'one object a line, e.g. {"submit_at": 0, "user": "ana", '
                                   '"kind": "SFT", "gpu_count": 1, "run_seconds": 3600}',
                             line=number)
        for name in value:
            if name not in COLUMNS:
                raise TraceError(path, f"unknown field {name!r}; the fields are "
                                       f"{', '.join(COLUMNS)}", line=number)
        yield _Row(number, {k: v for k, v in value.items() if v is not None and v != ""})


def _build(path: Path, rows: list[_Row], start: datetime | None) -> Trace:
    if not rows:
        raise TraceError(path, "has a header but no jobs")
    times = _times(path, rows, start)
    jobs: list[tuple[float, int, TraceJob]] = []
    external: list[tuple[float, int, ExternalUsage]] = []
    lines_by_id: dict[str, int] = {}
    for index, (row, at) in enumerate(zip(rows, times, strict=True)):
        kind = _kind(path, row)
        if kind == EXTERNAL:
            for name in ("outcome", "outcome_at", "after", "id"):
                if name in row.values:
                    raise TraceError(path, f"an {EXTERNAL} row (GPUs used outside the queue) "
                                           "takes no " + name + "; leave it empty",
                                     line=row.line, column=name)
            gpus = _whole(path, row, "gpu_count", minimum=0)
            external.append((at, index, ExternalUsage(at=at, gpus=gpus)))
            continue
        for name in REQUIRED:
            if name not in row.values:
                raise TraceError(path, f"is empty; every job needs {', '.join(REQUIRED)}",
                                 line=row.line, column=name)
        job_id = _text(path, row, "id") if "id" in row.values else f"L{row.line}"
        if job_id in lines_by_id:
            raise TraceError(path, f"id {job_id!r} is also the id of line "
                                   f"{lines_by_id[job_id]}; give each job its own id",
                             line=row.line, column="id")
        lines_by_id[job_id] = row.line
        outcome = _outcome(path, row)
        outcome_at = _seconds(path, row, "outcome_at") if "outcome_at" in row.values else None
        if outcome_at is not None and outcome == "SUCCESS":
            raise TraceError(path, "is set but outcome is SUCCESS (a job that succeeds ends "
                                   "when its run ends); set outcome to FAIL or CANCELLED, or "
                                   "leave outcome_at empty", line=row.line, column="outcome_at")
        run_seconds = _seconds(path, row, "run_seconds")
        if run_seconds <= 0:
            raise TraceError(path, f"is {run_seconds:g}; a job runs for more than 0 seconds",
                             line=row.line, column="run_seconds")
        job = TraceJob(
            id=job_id, submit_at=at, user=_text(path, row, "user"),
            kind=kind, gpu_count=_whole(path, row, "gpu_count", minimum=1),
            run_seconds=run_seconds, outcome=outcome, outcome_at=outcome_at,
            after=_after(path, row),
        )
        jobs.append((at, index, job))
    if not jobs:
        raise TraceError(path, f"has only {EXTERNAL} rows; a trace needs at least one job")
    jobs.sort(key=lambda item: (item[0], item[1]))
    external.sort(key=lambda item: (item[0], item[1]))
    ordered = tuple(job for _, _, job in jobs)
    _check_after(path, ordered, lines_by_id)
    return Trace(jobs=ordered, external=tuple(usage for _, _, usage in external))


def _times(path: Path, rows: list[_Row], start: datetime | None) -> list[float]:
    """Each row's submit_at in seconds from the start: all seconds, or all ISO times."""
    raw: list[float | datetime] = []
    for row in rows:
        if "submit_at" not in row.values:
            raise TraceError(path, "is empty; give seconds from the trace's start (e.g. 90) "
                                   "or an ISO 8601 time (e.g. 2024-05-01T09:30:00Z)",
                             line=row.line, column="submit_at")
        raw.append(_time(path, row))
    isos = [isinstance(value, datetime) for value in raw]
    if any(isos) and not all(isos):
        first_iso = rows[isos.index(True)].line
        first_secs = rows[isos.index(False)].line
        raise TraceError(path, f"mixes ISO times (line {first_iso}) with seconds (line "
                               f"{first_secs}); write every submit_at the same way",
                         column="submit_at")
    if not all(isos):
        return [float(value) for value in raw if isinstance(value, float)]
    stamps = [value for value in raw if isinstance(value, datetime)]
    origin = start if start is not None else min(stamps)
    if origin.tzinfo is None:
        origin = origin.replace(tzinfo=UTC)
    out: list[float] = []
    for row, stamp in zip(rows, stamps, strict=True):
        seconds = (stamp - origin).total_seconds()
        if seconds < 0:
            raise TraceError(path, f"is {-seconds:g} s before the start "
                                   f"({origin.isoformat()}); give a start no later than the "
                                   "earliest submit_at", line=row.line, column="submit_at")
        out.append(seconds)
    return out


def _time(path: Path, row: _Row) -> float | datetime:
    value = row.values["submit_at"]
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            try:
                stamp = datetime.fromisoformat(value)
            except ValueError:
                raise TraceError(path, f"{value!r} is neither seconds nor an ISO 8601 time; "
                                       "write e.g. 90 or 2024-05-01T09:30:00Z",
                                 line=row.line, column="submit_at") from None
            return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    return _seconds(path, row, "submit_at")


def _number(path: Path, row: _Row, column: str, hint: str) -> float:
    value = row.values[column]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TraceError(path, f"{json.dumps(value)} is not a number; {hint}",
                         line=row.line, column=column)
    try:
        number = float(value)
    except ValueError:
        raise TraceError(path, f"{value!r} is not a number; {hint}",
                         line=row.line, column=column) from None
    if not math.isfinite(number):
        raise TraceError(path, f"{value!r} is not a finite number; {hint}",
                         line=row.line, column=column)
    return number


def _seconds(path: Path, row: _Row, column: str) -> float:
    number = _number(path, row, column, "write seconds as a number of 0 or more, e.g. 3600")
    if number < 0:
        raise TraceError(path, f"is {number:g}; seconds are 0 or more",
                         line=row.line, column=column)
    return number


def _whole(path: Path, row: _Row, column: str, *, minimum: int) -> int:
    hint = f"write a whole number of {minimum} or more, e.g. 8"
    if column not in row.values:
        raise TraceError(path, f"is empty; {hint}", line=row.line, column=column)
    number = _number(path, row, column, hint)
    if number != int(number) or number < minimum:
        raise TraceError(path, f"{row.values[column]!r} is not allowed; {hint}",
                         line=row.line, column=column)
    return int(number)


def _text(path: Path, row: _Row, column: str) -> str:
    value = row.values[column]
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TraceError(path, f"{json.dumps(value)} is not text; write a string",
                         line=row.line, column=column)
    text = str(value).strip()
    if not text:
        raise TraceError(path, "is blank", line=row.line, column=column)
    if column == "user" and not USER_NAME.fullmatch(text):
        raise TraceError(path, f"{text!r} is not a user name the queue accepts; use 1 to 64 "
                               "letters, digits, '_', '.', '@' or '-', starting with a letter "
                               "or digit", line=row.line, column=column)
    if column == "id" and ";" in text:
        raise TraceError(path, f"{text!r} holds ';', which separates the ids of after; "
                               "choose an id without it", line=row.line, column=column)
    return text


def _kind(path: Path, row: _Row) -> str:
    if "kind" not in row.values:
        raise TraceError(path, f"is empty; write one of {', '.join(KINDS)} (or {EXTERNAL} "
                               "for GPUs used outside the queue)", line=row.line, column="kind")
    kind = str(row.values["kind"]).strip().upper()
    if kind not in (*KINDS, EXTERNAL):
        raise TraceError(path, f"{row.values['kind']!r} is not a kind; write one of "
                               f"{', '.join(KINDS)} (or {EXTERNAL} for GPUs used outside "
                               "the queue)", line=row.line, column="kind")
    return kind


def _outcome(path: Path, row: _Row) -> str:
    if "outcome" not in row.values:
        return "SUCCESS"
    outcome = str(row.values["outcome"]).strip().upper()
    if outcome not in OUTCOMES:
        raise TraceError(path, f"{row.values['outcome']!r} is not an outcome; write one of "
                               f"{', '.join(OUTCOMES)} (empty means SUCCESS)",
                         line=row.line, column="outcome")
    return outcome


def _after(path: Path, row: _Row) -> tuple[str, ...]:
    if "after" not in row.values:
        return ()
    value = row.values["after"]
    if isinstance(value, str):
        ids = [part.strip() for part in value.split(";")]
    elif isinstance(value, list) and all(isinstance(item, (str, int)) and
                                         not isinstance(item, bool) for item in value):
        ids = [str(item).strip() for item in value]
    else:
        raise TraceError(path, f"{json.dumps(value)} is not a list of ids; write ids "
                               'separated by ";" (CSV) or a JSON list of strings',
                         line=row.line, column="after")
    if any(not item for item in ids):
        raise TraceError(path, f"{value!r} has an empty id; separate ids with a single ';'",
                         line=row.line, column="after")
    if len(ids) > MAX_AFTER:
        raise TraceError(path, f"names {len(ids)} jobs; a job can run after at most "
                               f"{MAX_AFTER} (the queue's limit)", line=row.line, column="after")
    if len(set(ids)) != len(ids):
        raise TraceError(path, f"{value!r} names an id twice", line=row.line, column="after")
    return tuple(ids)


def _check_after(path: Path, jobs: tuple[TraceJob, ...], lines: Mapping[str, int]) -> None:
    """Every `after` names an earlier job of the trace, and no chain comes back on itself."""
    for job in jobs:
        for parent in job.after:
            if parent not in lines:
                raise TraceError(path, f"names {parent!r}, which is no job's id in this trace",
                                 line=lines[job.id], column="after")
    users = {job.id: job.user for job in jobs}
    for job in jobs:
        for parent in job.after:
            if users[parent] != job.user:
                raise TraceError(path, f"names {parent!r} (line {lines[parent]}), a job of "
                                       f"{users[parent]!r}; a job can only run after its own "
                                       f"user's jobs (the queue answers unknown_dependency)",
                                 line=lines[job.id], column="after")
    _check_cycles(path, jobs, lines)
    position = {job.id: index for index, job in enumerate(jobs)}
    for job in jobs:
        for parent in job.after:
            if position[parent] >= position[job.id]:
                raise TraceError(path, f"names {parent!r} (line {lines[parent]}), which is "
                                       "submitted after this job (or at the same time, "
                                       "further down the file); a job can only run after a "
                                       "job submitted before it",
                                 line=lines[job.id], column="after")


def _check_cycles(path: Path, jobs: tuple[TraceJob, ...], lines: Mapping[str, int]) -> None:
    parents = {job.id: job.after for job in jobs}
    done: set[str] = set()
    for root in parents:
        if root in done:
            continue
        # Iterative depth-first walk: chains of thousands of jobs must not hit the recursion limit.
        trail: list[str] = [root]
        on_trail = {root}
        stack: list[Iterator[str]] = [iter(parents[root])]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                finished = trail.pop()
                on_trail.discard(finished)
                done.add(finished)
                continue
            if nxt in on_trail:
                loop = [*trail[trail.index(nxt):], nxt]
                raise TraceError(path, "forms a cycle: " + " runs after ".join(loop) +
                                 "; a chain of after must end", line=lines[trail[-1]],
                                 column="after")
            if nxt in done:
                continue
            trail.append(nxt)
            on_trail.add(nxt)
            stack.append(iter(parents[nxt]))


# -- writing ------------------------------------------------------------------------------
def _num(value: float) -> str | int:
    return int(value) if float(value).is_integer() else repr(float(value))


def _records(trace: Trace) -> list[dict[str, Any]]:
    """The trace's rows in time order (external usage before jobs at the same second)."""
    rows: list[tuple[float, int, dict[str, Any]]] = []
    for usage in trace.external:
        rows.append((usage.at, 0, {"submit_at": _num(usage.at), "kind": EXTERNAL,
                                   "gpu_count": usage.gpus}))
    for job in trace.jobs:
        record: dict[str, Any] = {
            "id": job.id, "submit_at": _num(job.submit_at), "user": job.user, "kind": job.kind,
            "gpu_count": job.gpu_count, "run_seconds": _num(job.run_seconds),
        }
        if job.outcome != "SUCCESS":
            record["outcome"] = job.outcome
        if job.outcome_at is not None:
            record["outcome_at"] = _num(job.outcome_at)
        if job.after:
            record["after"] = list(job.after)
        rows.append((job.submit_at, 1, record))
    rows.sort(key=lambda item: (item[0], item[1]))
    return [record for _, _, record in rows]


def write_trace(trace: Trace, path: str | Path, *, comment: str | None = None) -> None:
    """Write a trace as JSON lines (.jsonl, .ndjson, .json) or CSV (anything else).

    `comment` (e.g. the command that made the file) goes on `#` lines at the top; the
    reader skips them.
    """
    path = Path(path)
    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    records = _records(trace)
    if path.suffix.lower() in JSONL_SUFFIXES:
        body = "".join(json.dumps(record, separators=(", ", ": ")) + "\n"
                       for record in records)
    else:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for record in records:
            if "after" in record:
                record = record | {"after": ";".join(record["after"])}
            writer.writerow(record)
        body = out.getvalue()
    path.write_text(head + body, encoding="utf-8")
