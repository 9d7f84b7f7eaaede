"""The MCP tools, written once over :class:`sftq_client.AsyncClient`.

Each tool is an input model (its ``inputSchema``), an output model (its ``outputSchema``) and an
async function that calls the client. Both transports (stdio: ``sftq mcp``; Streamable HTTP: the
stack's ``/functions/v1/mcp``) serve these very tools; they differ only in where the client comes
from (the environment, or the bearer key of each HTTP request).

Every failure becomes a tool error (``isError``) whose text is one JSON object
``{"error": {"code", "message", "status", "details"}}``: the API's own code and message when the
API answered, else a code of ours (``invalid_arguments``, ``ambiguous_job_id``, ``unavailable``,
``timeout``, ``configuration``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, WithJsonSchema

from .._client import AsyncClient
from ..errors import (
    AmbiguousJobId,
    APIConnectionError,
    ConfigurationError,
    SftqError,
)
from ..errors import Timeout as RequestTimeout
from ..models import (
    CancelResult,
    Capacity,
    Event,
    Job,
    JobAnalytics,
    QueueContext,
    RetryResult,
    SubmitResult,
)

__all__ = ["RULES", "TOOLS", "Progress", "Tool", "ToolError", "call_tool"]

RULES: Final = (
    "Rules of the queue: every fine-tuning job goes through it; never call the Fireworks "
    "fine-tuning API (or firectl ...-job create/cancel) directly. Each user runs at most one "
    "job at a time (an operator may raise that cap); admission is strict FIFO by submission "
    "time over all kinds, with no backfill: a later, smaller job never jumps ahead. You see "
    "and act only on your own jobs; another user's job id answers not_found."
)

# Job ids are UUIDs (or, where a tool says so, their first 8 or more hex digits); anything far
# longer is refused here instead of being sent on.
JobId = Annotated[str, Field(min_length=1, max_length=64, description=(
    "the job's id (a UUID as submit_job or list_jobs gave it), or its first 8 or more "
    "characters"))]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")]


def _upper_ascii(value: object) -> object:
    """Kinds and states in any case, as the HTTP API and the CLI take them ("sft" is SFT).
    ASCII only, as the API: str.upper() would also make "S" of U+017F (long s)."""
    return value.upper() if isinstance(value, str) and value.isascii() else value


def _any_case(*words: str) -> str:
    """A JSON Schema pattern matching each word in any case (JSON Schema has no (?i))."""
    return "^(" + "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in w) for w in words) + ")$"


KindArg = Annotated[
    Literal["SFT", "DPO", "RFT"], BeforeValidator(_upper_ascii),
    WithJsonSchema({"type": "string", "pattern": _any_case("SFT", "DPO", "RFT"),
                    "description": "SFT, DPO or RFT, in any case (sft is SFT)"})]
StateArg = Annotated[
    Literal["QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED"], BeforeValidator(_upper_ascii),
    WithJsonSchema({"type": "string",
                    "pattern": _any_case("QUEUED", "PROGRESS", "SUCCESS", "FAIL", "CANCELLED"),
                    "description": "QUEUED, PROGRESS, SUCCESS, FAIL or CANCELLED, in any case"})]
# The longest timeout_seconds accepted (older agents ask for up to an hour)...
MAX_WAIT_SECONDS: Final = 3600.0
# ...and the longest one call waits (issue 52): a wait holds one of its user's stream slots
# and a connection, so it is bounded well under the hour; past it the call answers
# timed_out=true and an agent that wants longer calls again.
WAIT_CAP_SECONDS: Final = 900.0


class ToolError(Exception):
    """A failure reported to the agent as a tool error, never as a protocol error."""

    def __init__(self, code: str, message: str, *, status: int | None = None,
                 details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.details = details

    def payload(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.status is not None:
            error["status"] = self.status
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}

    def text(self) -> str:
        return json.dumps(self.payload(), default=str)


# ---- inputs --------------------------------------------------------------------------------------


class _Input(BaseModel):
    # A typo in an argument name must be an error, not silently ignored (as the API refuses
    # unknown body fields).
    model_config = ConfigDict(extra="forbid", strict=False)


class SubmitJobInput(_Input):
    kind: KindArg = Field(description=(
        "SFT (supervisedFineTuningJobs), DPO (dpoJobs) or RFT (reinforcementFineTuningJobs), "
        "in any case"))
    fireworks_payload: dict[str, Any] = Field(description=(
        "the exact Fireworks request body you would have sent to Fireworks for this kind; "
        "the queue passes it through at admission"))
    display_name: str | None = Field(default=None, max_length=256)
    gpu_count: int | None = Field(default=None, ge=1, le=64, strict=True, description=(
        "GPUs this job will use (default 4); admission waits until they fit the live quota"))
    idempotency_key: IdempotencyKey | None = Field(default=None, description=(
        "any unique string; resubmitting with the same key (after a lost connection) answers "
        "the same job instead of making a second one. Always pass one."))
    after: list[str] | None = Field(default=None, max_length=20, description=(
        "up to 20 of your job ids (or their first 8+ characters): this job waits QUEUED "
        "until every one of them is SUCCESS (waiting_for_dependency), and is cancelled if one "
        "ends FAIL or CANCELLED. E.g. an SFT job's id for a DPO job whose warmStartFrom is "
        "that SFT job's outputModel: submit both at once."))


class ListJobsInput(_Input):
    state: StateArg | None = None
    kind: KindArg | None = None
    limit: int = Field(default=20, ge=1, le=100, strict=True)
    cursor: str | None = Field(default=None, max_length=512, description=(
        "next_cursor of the previous page, to read older jobs"))


class JobIdInput(_Input):
    job_id: JobId


class RetryJobInput(_Input):
    job_id: JobId
    idempotency_key: IdempotencyKey | None = None


class JobEventsInput(_Input):
    job_id: JobId
    limit: int = Field(default=100, ge=1, le=1000, strict=True)
    after: str | None = Field(default=None, max_length=64, description=(
        "the id of the last event you have; only later events are answered"))


class QueuePositionInput(_Input):
    job_id: JobId | None = Field(default=None, description=(
        "one of your jobs to explain in detail (why it waits, when it should start); "
        "without it, all of your queued jobs"))


class NoInput(_Input):
    pass


class WaitForJobInput(_Input):
    job_id: JobId
    timeout_seconds: float = Field(default=60.0, gt=0, le=MAX_WAIT_SECONDS, description=(
        "return after this many seconds at the latest, terminal or not (one call waits "
        "900 at most, then answers timed_out: call again)"))
    poll_interval_seconds: float = Field(default=2.0, ge=0.2, le=60, description=(
        "seconds between the first looks at the job; backs off while nothing changes"))


# ---- outputs -------------------------------------------------------------------------------------


class _Output(BaseModel):
    model_config = ConfigDict(extra="ignore")


class JobList(_Output):
    jobs: list[Job]
    next_cursor: str | None = None


class EventList(_Output):
    events: list[Event]
    has_more: bool = False


class QueuePosition(_Output):
    queue: QueueContext = Field(description=(
        "your running job, your queued jobs (queue_position = other users' queued jobs "
        "ahead, waiting_reason, estimated_start_at, estimate) and the global queue"))
    job: JobAnalytics | None = Field(default=None, description=(
        "the job asked about: position, waiting_reason and estimate when QUEUED, "
        "estimated_finish_at and progress when PROGRESS"))


class WaitResult(_Output):
    job: Job
    terminal: bool = Field(description="the job is SUCCESS, FAIL or CANCELLED")
    timed_out: bool = Field(description="timeout_seconds passed first; call again to go on")
    waited_seconds: float


# ---- the tools -----------------------------------------------------------------------------------


# Reports progress (elapsed, total, message) while a tool runs; a no-op when the caller gave no
# progress token.
Progress = Callable[[float, float | None, str], Awaitable[None]]


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    input: type[_Input]
    output: type[BaseModel]
    run: Callable[[AsyncClient, Any, Progress], Awaitable[BaseModel]]
    read_only: bool = True
    idempotent: bool = True


async def _submit(client: AsyncClient, a: SubmitJobInput, progress: Progress) -> SubmitResult:
    return await client.submit(a.kind, a.fireworks_payload, display_name=a.display_name,
                               gpu_count=a.gpu_count, idempotency_key=a.idempotency_key,
                               after=a.after)


async def _list(client: AsyncClient, a: ListJobsInput, progress: Progress) -> JobList:
    page = await client.list_jobs(state=a.state, kind=a.kind, limit=a.limit, cursor=a.cursor)
    return JobList(jobs=page.items, next_cursor=page.next_cursor)


async def _get(client: AsyncClient, a: JobIdInput, progress: Progress) -> Job:
    return await client.get(await client.resolve_job_id(a.job_id))


async def _cancel(client: AsyncClient, a: JobIdInput, progress: Progress) -> CancelResult:
    return await client.cancel(await client.resolve_job_id(a.job_id))


async def _retry(client: AsyncClient, a: RetryJobInput, progress: Progress) -> RetryResult:
    job_id = await client.resolve_job_id(a.job_id)
    return await client.retry(job_id, idempotency_key=a.idempotency_key)


async def _events(client: AsyncClient, a: JobEventsInput, progress: Progress) -> EventList:
    job_id = await client.resolve_job_id(a.job_id)
    page = await client._send(client._core.events_page(job_id, limit=a.limit, after=a.after))
    return EventList(events=page.data, has_more=page.has_more)


async def _queue(client: AsyncClient, a: QueuePositionInput, progress: Progress) -> QueuePosition:
    if a.job_id is None:
        return QueuePosition(queue=await client.queue_context())
    job_id = await client.resolve_job_id(a.job_id)
    job, queue = await asyncio.gather(client.job_analytics(job_id), client.queue_context())
    return QueuePosition(queue=queue, job=job)


async def _capacity(client: AsyncClient, a: NoInput, progress: Progress) -> Capacity:
    return await client.capacity()


def _describe(job: Job) -> str:
    text = f"job {job.id} is {job.state}"
    if job.error:
        text += f": {job.error}"
    return text


async def _wait(client: AsyncClient, a: WaitForJobInput, progress: Progress) -> WaitResult:
    started = time.monotonic()
    timeout = min(a.timeout_seconds, WAIT_CAP_SECONDS)
    deadline = started + timeout
    last: Job | None = None
    delay = a.poll_interval_seconds
    try:
        # The whole wait, requests included, ends at the agent's timeout: a slow answer never
        # holds the call past it.
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + timeout):
            job_id = await client.resolve_job_id(a.job_id)
            while True:
                job = await client.get(job_id)
                elapsed = time.monotonic() - started
                if last is None or job.state != last.state:
                    delay = a.poll_interval_seconds
                else:
                    delay = min(delay * 1.5, 30.0)
                last = job
                await progress(elapsed, timeout, _describe(job))
                if job.is_terminal:
                    return WaitResult(job=job, terminal=True, timed_out=False,
                                      waited_seconds=round(elapsed, 3))
                await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
    except TimeoutError:
        if last is None:
            raise ToolError("timeout", f"no answer from the jobs-api within "
                            f"{timeout:g}s") from None
        return WaitResult(job=last, terminal=last.is_terminal, timed_out=True,
                          waited_seconds=round(time.monotonic() - started, 3))


_JOB_ID_NOTE = " job_id may be the full id or its first 8 or more characters."

TOOLS: Final[tuple[Tool, ...]] = (
    Tool("submit_job", "Submit a fine-tuning job",
         "Enqueue a Fireworks fine-tuning job (SFT, DPO or RFT) through the finetune-queue "
         "scheduler. Use this INSTEAD of calling Fireworks: the queue submits the job to "
         "Fireworks itself when it is admitted. The job starts QUEUED; it runs when it is first "
         "in line, you have no other running job, and its GPUs fit the live quota. Pass an "
         "idempotency_key so that a resubmission after a lost connection answers the same job. "
         + RULES,
         SubmitJobInput, SubmitResult, _submit, read_only=False, idempotent=False),
    Tool("list_jobs", "List your jobs",
         "Your jobs, newest first, optionally by state and kind (one page of at most limit; "
         "pass next_cursor back as cursor for older ones).",
         ListJobsInput, JobList, _list),
    Tool("get_job", "Get one job",
         "One of your jobs: state (QUEUED, PROGRESS, SUCCESS, FAIL, CANCELLED), times, the "
         "Fireworks job name once submitted, error and failure_class for a FAIL." + _JOB_ID_NOTE,
         JobIdInput, Job, _get),
    Tool("cancel_job", "Cancel a job",
         "Cancel one of your jobs. QUEUED or PROGRESS: cancelled at once (the queue stops a "
         "running job at Fireworks during the call) and answered CANCELLED with "
         "pending=false. Only when Fireworks cannot be reached, or the job is being submitted "
         "at that very moment, is the answer pending=true: the cancel is recorded and the "
         "scheduler finishes it at its next tick. A finished job answers the error "
         "job_terminal." + _JOB_ID_NOTE,
         JobIdInput, CancelResult, _cancel, read_only=False),
    Tool("retry_job", "Retry a failed or cancelled job",
         "Enqueue a FAIL or CANCELLED job again as a new job (same kind, payload, name and "
         "GPUs) at the back of the queue; retry_of names the old one. Other states answer "
         "job_not_retryable." + _JOB_ID_NOTE,
         RetryJobInput, RetryResult, _retry, read_only=False, idempotent=False),
    Tool("job_events", "A job's history",
         "The events of one of your jobs, oldest first: queued, admitted, submitted, provider "
         "states, cancelled, succeeded, failed, each with the state after it and a message."
         + _JOB_ID_NOTE,
         JobEventsInput, EventList, _events),
    Tool("queue_position", "Why a job waits, and until when",
         "Your place in the queue: for each of your QUEUED jobs, how many other users' jobs are "
         "ahead, why it waits (waiting_reason: behind_own_running_job, does_not_fit, ...) and "
         "when it should start (an estimate, from the same walk admission makes). With job_id, "
         "also that job in detail." + _JOB_ID_NOTE,
         QueuePositionInput, QueuePosition, _queue),
    Tool("capacity", "The queue's capacity",
         "The Fireworks GPU quota as the scheduler last read it, the free GPUs, what runs and "
         "waits overall and per user, and whether the scheduler ticks.",
         NoInput, Capacity, _capacity),
    Tool("wait_for_job", "Wait for a job to finish",
         "Wait until one of your jobs is SUCCESS, FAIL or CANCELLED, or until timeout_seconds "
         "pass (never longer), sending progress notifications as it looks. timed_out=true means "
         "it is still running or queued: call again to keep waiting. Training takes minutes to "
         "hours; do not hold a wait you do not need." + _JOB_ID_NOTE,
         WaitForJobInput, WaitResult, _wait),
)
TOOLS_BY_NAME: Final[dict[str, Tool]] = {tool.name: tool for tool in TOOLS}


# ---- calling -------------------------------------------------------------------------------------


def _validation_message(error: ValidationError) -> tuple[str, list[dict[str, str]]]:
    details = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in item.get("loc", ())) or "(arguments)"
        # `path` as the API's details name where (issue 54.13); `field` kept for callers.
        details.append({"field": where, "path": where, "message": str(item.get("msg", "invalid"))})
    summary = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
    return f"invalid arguments: {summary}", details


def tool_error_for(exc: Exception) -> ToolError:
    """The tool error an exception becomes (its code and message as the API gave them)."""
    if isinstance(exc, ToolError):
        return exc
    if isinstance(exc, ValidationError):
        message, details = _validation_message(exc)
        return ToolError("invalid_arguments", message, details=details)
    if isinstance(exc, AmbiguousJobId):
        return ToolError("ambiguous_job_id", exc.message,
                         details={"candidates": [j.id for j in exc.candidates]})
    if isinstance(exc, ConfigurationError):
        return ToolError("configuration", exc.message)
    if isinstance(exc, RequestTimeout):
        return ToolError("timeout", exc.message)
    if isinstance(exc, APIConnectionError):
        return ToolError("unavailable", exc.message)
    if isinstance(exc, SftqError):
        code = exc.code or ("not_found" if exc.status == 404 else "error")
        return ToolError(code, exc.message, status=exc.status, details=exc.details)
    if isinstance(exc, (ValueError, TypeError)):
        return ToolError("invalid_arguments", str(exc))
    return ToolError("internal", f"{type(exc).__name__} in the MCP server")


async def _no_progress(elapsed: float, total: float | None, message: str) -> None:
    return None


async def call_tool(client: AsyncClient, name: str, arguments: Any,
                    progress: Progress = _no_progress) -> dict[str, Any]:
    """Run one tool; its structured output as JSON-ready data. Raises ToolError only."""
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        raise ToolError("unknown_tool", f"no tool named {name!r}; list_tools names them",
                        details={"tools": list(TOOLS_BY_NAME)})
    if not isinstance(arguments, dict):
        raise ToolError("invalid_arguments", "arguments must be a JSON object")
    try:
        args = tool.input.model_validate(arguments)
        result = await tool.run(client, args, progress)
    except Exception as exc:  # every failure is the agent's to read, never a protocol error
        raise tool_error_for(exc) from exc
    data: dict[str, Any] = result.model_dump(mode="json")
    return data


def input_schema(tool: Tool) -> dict[str, Any]:
    return tool.input.model_json_schema()


def output_schema(tool: Tool) -> dict[str, Any]:
    return tool.output.model_json_schema(mode="serialization")
