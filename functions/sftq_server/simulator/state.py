"""The simulated Fireworks account: its jobs, their lifecycle, the GPU quota, and the Python
control helpers (the same operations as the `/_sim` surface).

Job state is computed lazily from the clock rather than by a background thread, so a fake
clock makes the simulator fully deterministic and there is nothing to stop but the server.
"""

from __future__ import annotations

import base64
import binascii
import copy
import random
import string
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sftq_server.simulator.resources import RateLimit, Resources
from sftq_server.simulator.rules import DEFAULT_TIMEOUT_SECONDS, Faults
from sftq_server.simulator.store import StateFileError, read_state, write_state
from sftq_server.simulator.validation import (
    OUTPUT_ONLY,
    HttpError,
    integer,
    job_epochs,
    job_gpus,
    number,
    valid_id,
    validate_payload,
)

# collection -> (kind, query parameter that carries the caller-chosen id)
COLLECTIONS: dict[str, tuple[str, str]] = {
    "supervisedFineTuningJobs": ("SFT", "supervisedFineTuningJobId"),
    "dpoJobs": ("DPO", "dpoJobId"),
    "reinforcementFineTuningJobs": ("RFT", "reinforcementFineTuningJobId"),
}
KIND_TO_COLLECTION = {kind: coll for coll, (kind, _) in COLLECTIONS.items()}

COMPLETED = "JOB_STATE_COMPLETED"
CANCELLED = "JOB_STATE_CANCELLED"
FINISH_STATES = frozenset(
    {
        COMPLETED,
        "JOB_STATE_FAILED",
        "JOB_STATE_EXPIRED",
        "JOB_STATE_EARLY_STOPPED",
        CANCELLED,
    }
)
TERMINAL_STATES = FINISH_STATES | {"JOB_STATE_DELETED"}
# Every state Fireworks documents; `/_sim/jobs/.../ID:state` may hold a job in any of them.
ALL_STATES = frozenset(
    "JOB_STATE_" + name for name in (
        "UNSPECIFIED", "CREATING", "PENDING", "VALIDATING", "RUNNING", "WRITING_RESULTS",
        "COMPLETED", "FAILED", "CANCELLED", "CANCELLING", "DELETING", "DELETING_CLEANING_UP",
        "EXPIRED", "EARLY_STOPPED", "PAUSED", "RE_QUEUEING", "CREATING_INPUT_DATASET", "IDLE",
        "DELETED"))
# Other quotas an account lists besides the training one the queue budgets on.
OTHER_QUOTAS = ("training-h100-count", "training-b200-count", "training-a100-count",
                "serverless-inference-rpm", "deployments-count")
# The states a job passes through on its own, in order (see SimState._state).
LIFECYCLE = (
    "JOB_STATE_CREATING",
    "JOB_STATE_PENDING",
    "JOB_STATE_RUNNING",
    "JOB_STATE_WRITING_RESULTS",
    COMPLETED,
)

_FINISH_STATUS = {
    COMPLETED: "OK",
    # A failure with no code given is the platform's own (an infrastructure fault); a user's
    # mistake is finished with the code Fireworks gives it (`:finish` with "code").
    "JOB_STATE_FAILED": "INTERNAL",
    "JOB_STATE_EXPIRED": "DEADLINE_EXCEEDED",
    "JOB_STATE_EARLY_STOPPED": "OK",
    CANCELLED: "CANCELLED",
}
# The google.rpc codes a job's status may carry (`status.code` in Fireworks' JSON). Fireworks
# fails a job over the user's data or settings with INVALID_ARGUMENT or FAILED_PRECONDITION
# (the queue classes those permanent) and over its own faults with INTERNAL or UNAVAILABLE.
STATUS_CODES = frozenset({
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"})


# What a simulated GPU-hour costs, for `estimatedCost` (a made-up figure, in USD).
GPU_HOUR_USD = 2.5
LIST_PAGE_DEFAULT = 50
LIST_PAGE_MAX = 200
# A long-running demo server must not grow without bound; tests stay far below this.
MAX_RECORDED_REQUESTS = 100_000


@dataclass
class SimJob:
    collection: str
    job_id: str
    payload: dict[str, Any]
    gpus: int
    created: float
    job_seconds: float
    final_state: str | None = None
    final_message: str | None = None
    final_at: float | None = None
    final_code: str | None = None
    # A state it is held in (/_sim ... :state) until told otherwise, and a jobProgress.
    held_state: str | None = None
    held_at: float | None = None
    held_progress: dict[str, Any] | None = None


def _money(usd: float) -> dict[str, Any]:
    # google.type.Money, as proto3 JSON writes it: int64 units as a string, int32 nanos.
    units = int(usd)
    return {"currencyCode": "USD", "units": str(units), "nanos": int(round((usd - units) * 1e9))}


class SimState:
    """The account's state and the operations on it; `Simulator` adds the HTTP surface."""

    def __init__(
        self,
        *,
        account_id: str = "sim-account",
        job_seconds: float = 60.0,
        max_value: int = 64,
        value: int | None = None,
        quota_id: str = "training-h200-count",
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
        state_file: str | Path | None = None,
    ) -> None:
        if job_seconds < 0:
            raise ValueError("job_seconds must be >= 0 (0: jobs never finish on their own)")
        self.account_id = account_id
        self.job_seconds = float(job_seconds)
        self.quota_id = quota_id
        self._default_max_value = integer(max_value, "max_value")
        self._default_value = None if value is None else integer(value, "value")
        self._clock = clock
        self._seed = seed
        # Wall-clock timestamps are derived from the (possibly fake) clock so that they move
        # with it: createTime and completedTime agree with the lifecycle the clock drives.
        self._t0 = clock()
        self._epoch = time.time()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._reset_locked()
        # Where the account is kept across restarts (None: in memory only, as in tests).
        self.state_file = None if state_file is None else Path(state_file)
        if self.state_file is not None:
            saved = read_state(self.state_file)
            if saved is not None:
                try:
                    self._restore(saved)
                except (KeyError, TypeError, ValueError) as exc:
                    self._reset_locked()
                    raise StateFileError(
                        f"the simulator's state file {self.state_file} could not be read back "
                        f"({type(exc).__name__}: {exc}); remove it to start with an empty "
                        "account") from exc

    def _reset_locked(self) -> None:
        self._jobs: dict[tuple[str, str], SimJob] = {}
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED_REQUESTS)
        self._faults = Faults()
        self._rng = random.Random(self._seed)
        self._max_value = self._default_max_value
        self._value = (
            self._default_max_value if self._default_value is None else self._default_value
        )
        self._external_usage: float = 0
        self._usage_lag = 0.0
        self._offset = 0.0
        # Fireworks refuses a create its quota has no room for (429 quota_exceeded). The
        # simulator counts such creates always, and refuses them only when asked to.
        self._enforce_quota = False
        self._over_quota_creates = 0
        self._resources = Resources()
        self._rate = RateLimit()

    # -- time and lifecycle -----------------------------------------------------------------

    def _now(self) -> float:
        return self._clock() + self._offset

    def _timestamp(self, at: float) -> str:
        moment = datetime.fromtimestamp(self._epoch + (at - self._t0), tz=UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    @staticmethod
    def _age(job: SimJob, now: float) -> float:
        # To the microsecond: clock readings are large floats, and (t0 + 100.0) - t0 can come
        # out a hair under 100.0, which would put a job at the very end of its run a phase
        # early. No provider reports time finer than that.
        return round(now - job.created, 6)

    @staticmethod
    def _phase_seconds(job: SimJob) -> float:
        # CREATING then PENDING share the first min(1 s, job_seconds / 10); WRITING_RESULTS
        # takes as long at the end. A job that never finishes by itself (0) goes straight
        # to RUNNING.
        return min(1.0, job.job_seconds / 10)

    def _state(self, job: SimJob, now: float) -> tuple[str, float]:
        """The job's state at `now` and when it entered it."""
        if job.final_state is not None and job.final_at is not None:
            return job.final_state, job.final_at
        if job.held_state is not None and job.held_at is not None:
            return job.held_state, job.held_at
        elapsed = self._age(job, now)
        total = job.job_seconds
        if total > 0 and elapsed >= total:
            return COMPLETED, job.created + total
        phase = self._phase_seconds(job)
        if elapsed < phase / 2:
            return "JOB_STATE_CREATING", job.created
        if elapsed < phase:
            return "JOB_STATE_PENDING", job.created + phase / 2
        if total > 0 and elapsed >= total - phase:
            return "JOB_STATE_WRITING_RESULTS", job.created + total - phase
        return "JOB_STATE_RUNNING", job.created + phase

    def _progress(self, job: SimJob, state: str, now: float) -> dict[str, Any] | None:
        """jobProgress: a percent that grows with time and the current epoch (1-based)."""
        if job.held_progress is not None:
            return copy.deepcopy(job.held_progress)
        if job.job_seconds <= 0:
            return None
        epochs = job_epochs(job.payload)
        if state == COMPLETED:
            return {"percent": 100, "epoch": epochs}
        if state not in ("JOB_STATE_RUNNING", "JOB_STATE_WRITING_RESULTS"):
            return None
        fraction = max(0.0, min(1.0, self._age(job, now) / job.job_seconds))
        percent = max(0, min(99, int(100 * fraction)))
        return {"percent": percent, "epoch": min(epochs, int(fraction * epochs) + 1)}

    def _resource(self, job: SimJob, now: float) -> dict[str, Any]:
        state, since = self._state(job, now)
        # Output-only fields in a create body are ignored by Fireworks, never echoed.
        resource = {k: copy.deepcopy(v) for k, v in job.payload.items() if k not in OUTPUT_ONLY}
        resource.setdefault("displayName", job.job_id)
        resource["name"] = f"accounts/{self.account_id}/{job.collection}/{job.job_id}"
        resource["state"] = state
        if state in FINISH_STATES:
            code = job.final_code if job.final_state == state and job.final_code else (
                _FINISH_STATUS[state])
            resource["status"] = {"code": code, "message": job.final_message or ""}
        else:
            resource["status"] = {"code": "OK", "message": ""}
        resource["createTime"] = self._timestamp(job.created)
        resource["updateTime"] = self._timestamp(since)
        if state in TERMINAL_STATES:
            resource["completedTime"] = self._timestamp(since)
        progress = self._progress(job, state, now)
        if progress is not None:
            resource["jobProgress"] = progress
        if job.job_seconds > 0 and state != "JOB_STATE_CREATING":
            resource["estimatedCost"] = _money(job.gpus * job.job_seconds / 3600 * GPU_HOUR_USD)
        return resource

    # -- quota ------------------------------------------------------------------------------

    def _usage(self, now: float) -> float:
        held = sum(
            job.gpus
            for job in self._jobs.values()
            if self._age(job, now) >= self._usage_lag
            and self._state(job, now)[0] not in TERMINAL_STATES
        )
        return held + self._external_usage

    def _true_usage(self, now: float) -> float:
        """What the account really holds now: every job not ended, however recent (no lag),
        plus the external usage. The quota is enforced against this, not against `usage`."""
        held = sum(
            job.gpus
            for job in self._jobs.values()
            if self._state(job, now)[0] not in TERMINAL_STATES
        )
        return held + self._external_usage

    def _limit(self) -> int:
        return min(self._value, self._max_value)

    def _quota_resource(self, now: float) -> dict[str, Any]:
        usage = self._usage(now)
        return {
            "name": f"accounts/{self.account_id}/quotas/{self.quota_id}",
            # int64 values travel as strings in Fireworks' JSON; usage is a double.
            "value": str(self._value),
            "maxValue": str(self._max_value),
            "usage": int(usage) if float(usage).is_integer() else usage,
            "updateTime": self._timestamp(now),
        }

    def _quota_settings(self) -> dict[str, Any]:
        return {
            "maxValue": self._max_value,
            "value": self._value,
            "external_usage": self._external_usage,
            "usage_lag_seconds": self._usage_lag,
            "enforce_quota": self._enforce_quota,
            "true_usage": self._true_usage(self._now()),
            "over_quota_creates": self._over_quota_creates,
            "quota": self._quota_resource(self._now()),
        }

    # -- jobs -------------------------------------------------------------------------------

    def _find(self, collection: str, job_id: str) -> SimJob:
        if collection in KIND_TO_COLLECTION:
            collection = KIND_TO_COLLECTION[collection]
        job = self._jobs.get((collection, job_id))
        if job is None:
            name = f"accounts/{self.account_id}/{collection}/{job_id}"
            raise KeyError(f'{collection[:-1]} "{name}" not found')
        return job

    def _create(
        self,
        collection: str,
        kind: str,
        job_id: str | None,
        body: Any,
        gpu_header: str | None,
        now: float,
    ) -> dict[str, Any]:
        validate_payload(kind, body)
        payload: dict[str, Any] = body
        missing = self._resources.missing_for(kind, payload, self.account_id)
        if missing is not None:
            # What Fireworks answers for a create naming a dataset or model it does not have.
            raise HttpError(404, missing)
        if job_id is None or job_id == "":
            job_id = self._generate_id(collection)
        elif not valid_id(job_id):
            raise HttpError(
                400,
                f"invalid argument: id {job_id!r} must be 1-63 characters of [a-z0-9-], "
                "not starting or ending with '-'",
            )
        if (collection, job_id) in self._jobs:
            name = f"accounts/{self.account_id}/{collection}/{job_id}"
            raise HttpError(409, f'{collection[:-1]} "{name}" already exists')
        gpus = job_gpus(payload, gpu_header)
        in_use = self._true_usage(now)
        if in_use + gpus > self._limit():
            # A create the quota has no room for at the account's true usage (the lagging
            # `usage` figure aside): what Fireworks refuses with 429 quota_exceeded.
            self._over_quota_creates += 1
            if self._enforce_quota:
                self._save()
                raise HttpError(
                    429,
                    f"quota_exceeded: quota {self.quota_id} has no room for {gpus} more "
                    f"(in use {in_use:g} of {self._limit()})",
                )
        job = SimJob(
            collection=collection,
            job_id=job_id,
            payload=copy.deepcopy(payload),
            gpus=gpus,
            created=now,
            job_seconds=self.job_seconds,
        )
        self._jobs[(collection, job_id)] = job
        self._save()
        return self._resource(job, now)

    def _estimate(self, body: Any, gpu_header: str | None) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise HttpError(400, "invalid argument: the body must be a JSON object")
        gpus = job_gpus(body, gpu_header)
        return {"estimatedCost": _money(gpus * self.job_seconds / 3600 * GPU_HOUR_USD)}

    def _quota_list(self, query: dict[str, str], now: float) -> dict[str, Any]:
        raw_size = query.get("pageSize", "")
        try:
            size = int(raw_size) if raw_size else LIST_PAGE_DEFAULT
        except ValueError:
            raise HttpError(400, f"invalid argument: pageSize {raw_size!r}") from None
        if size < 0:
            raise HttpError(400, "invalid argument: pageSize must not be negative")
        size = min(size or LIST_PAGE_DEFAULT, LIST_PAGE_MAX)
        ids = sorted({self.quota_id, *OTHER_QUOTAS})
        after = self._decode_token("quotas", query.get("pageToken", ""))
        remaining = [q for q in ids if q > after] if after else ids
        page = remaining[:size]
        quotas = [self._quota_resource(now) if q == self.quota_id else self._other_quota(q, now)
                  for q in page]
        envelope: dict[str, Any] = {"quotas": quotas, "totalSize": len(ids)}
        if len(remaining) > size:
            envelope["nextPageToken"] = self._encode_token("quotas", page[-1])
        return envelope

    def _other_quota(self, quota_id: str, now: float) -> dict[str, Any]:
        return {"name": f"accounts/{self.account_id}/quotas/{quota_id}", "value": "8",
                "maxValue": "8", "usage": 0, "updateTime": self._timestamp(now)}

    def _generate_id(self, collection: str) -> str:
        alphabet = string.ascii_lowercase + string.digits
        while True:
            candidate = self._rng.choice(string.ascii_lowercase) + "".join(
                self._rng.choice(alphabet) for _ in range(15)
            )
            if (collection, candidate) not in self._jobs:
                return candidate

    def _delete(self, collection: str, job_id: str) -> None:
        # Fireworks removes the resource (possibly via JOB_STATE_DELETING); here at once.
        del self._jobs[(collection, job_id)]
        self._save()

    def _cancel(self, job: SimJob, now: float) -> None:
        # Cancelling a finished job leaves it as it is (Fireworks' behaviour here is
        # unconfirmed; answering 200 keeps a cancel that races completion harmless).
        if job.final_state is None and self._state(job, now)[0] not in TERMINAL_STATES:
            job.final_state, job.final_message, job.final_at = CANCELLED, None, now
            job.final_code = None
            self._save()

    def _list(self, collection: str, query: dict[str, str], now: float) -> dict[str, Any]:
        raw_size = query.get("pageSize", "")
        try:
            size = int(raw_size) if raw_size else 0
        except ValueError:
            raise HttpError(400, f"invalid argument: pageSize {raw_size!r}") from None
        if size < 0:
            raise HttpError(400, "invalid argument: pageSize must not be negative")
        size = min(size or LIST_PAGE_DEFAULT, LIST_PAGE_MAX)
        after = self._decode_token(collection, query.get("pageToken", ""))
        # Fireworks' default order is by name. Tokens carry the last name served (a keyset,
        # not an offset), so jobs created or deleted between pages never shift a page.
        # `filter` and `orderBy` are accepted and ignored.
        jobs = sorted(
            (job for (coll, _), job in self._jobs.items() if coll == collection),
            key=lambda job: job.job_id,
        )
        remaining = [job for job in jobs if job.job_id > after] if after else jobs
        page = remaining[:size]
        envelope: dict[str, Any] = {
            collection: [self._resource(job, now) for job in page],
            "totalSize": len(jobs),
        }
        if len(remaining) > size:
            envelope["nextPageToken"] = self._encode_token(collection, page[-1].job_id)
        return envelope

    @staticmethod
    def _encode_token(collection: str, last_id: str) -> str:
        return base64.urlsafe_b64encode(f"{collection}/{last_id}".encode()).decode().rstrip("=")

    @staticmethod
    def _decode_token(collection: str, token: str) -> str:
        if not token:
            return ""
        try:
            padded = token + "=" * (-len(token) % 4)
            coll, _, last_id = base64.urlsafe_b64decode(padded).decode().partition("/")
            if coll == collection and valid_id(last_id):
                return last_id
        except (binascii.Error, UnicodeDecodeError, ValueError):
            pass
        raise HttpError(400, "invalid argument: pageToken")

    # -- sleeping (injected latency and timeouts) -------------------------------------------

    def _release_sleepers(self) -> None:
        # Injected timeouts and latency sleep on this event, so stopping or resetting the
        # simulator never waits out a 15-second fault.
        with self._lock:
            wake, self._wake = self._wake, threading.Event()
        wake.set()

    def _sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        with self._lock:
            wake = self._wake
        wake.wait(seconds)

    # -- Python control helpers (same semantics as /_sim) -----------------------------------

    def set_quota(
        self,
        *,
        max_value: int | None = None,
        value: int | None = None,
        external_usage: float | None = None,
        usage_lag_seconds: float | None = None,
        enforce_quota: bool | None = None,
    ) -> dict[str, Any]:
        """Change the quota; `value` follows `max_value` unless given. `enforce_quota`: refuse
        a create the quota has no room for (429 quota_exceeded). Returns the settings."""
        new_max = None if max_value is None else integer(max_value, "maxValue")
        new_value = None if value is None else integer(value, "value")
        ext = None if external_usage is None else number(external_usage, "external_usage")
        lag = None if usage_lag_seconds is None else number(usage_lag_seconds, "usage_lag")
        if enforce_quota is not None and not isinstance(enforce_quota, bool):
            raise ValueError("enforce_quota must be true or false")
        with self._lock:
            if new_max is not None:
                self._max_value = new_max
                self._value = new_max if new_value is None else new_value
            elif new_value is not None:
                self._value = new_value
            if ext is not None:
                self._external_usage = int(ext) if ext.is_integer() else ext
            if lag is not None:
                self._usage_lag = lag
            if enforce_quota is not None:
                self._enforce_quota = enforce_quota
            self._save()
            return self._quota_settings()

    def quota(self) -> dict[str, Any]:
        """The quota settings and the quota resource as GET .../quotas/{id} shows it now."""
        with self._lock:
            return self._quota_settings()

    def finish(
        self,
        collection: str,
        job_id: str,
        state: str,
        message: str | None = None,
        code: str | None = None,
    ) -> dict[str, Any]:
        """Force a job into a terminal state (KeyError if unknown, ValueError if bad state).

        `collection` may also be a kind name (SFT, DPO, RFT). `code`: the google.rpc code its
        `status` carries (default: the state's own, INTERNAL for JOB_STATE_FAILED); a user's
        mistake fails with INVALID_ARGUMENT or FAILED_PRECONDITION, as at Fireworks.
        """
        if state not in FINISH_STATES:
            raise ValueError(f"state must be one of {', '.join(sorted(FINISH_STATES))}")
        if message is not None and not isinstance(message, str):
            raise ValueError("message must be a string")
        if code is not None and code not in STATUS_CODES:
            raise ValueError(f"code must be one of {', '.join(sorted(STATUS_CODES))}")
        with self._lock:
            job = self._find(collection, job_id)
            now = self._now()
            job.final_state = state
            job.final_message = message
            job.final_at = now
            job.final_code = code
            self._save()
            return self._resource(job, now)

    def set_state(self, collection: str, job_id: str, state: str | None,
                  progress: dict[str, Any] | None = None,
                  message: str | None = None) -> dict[str, Any]:
        """Hold a job in any documented state (PAUSED, RE_QUEUEING, VALIDATING, ...) with an
        optional jobProgress, until the next call; a terminal state finishes it as finish()
        does; state None lets it run its own lifecycle again."""
        if state is not None and state not in ALL_STATES:
            raise ValueError(f"state must be null or one of {', '.join(sorted(ALL_STATES))}")
        if progress is not None and not isinstance(progress, dict):
            raise ValueError("jobProgress must be an object")
        if message is not None and not isinstance(message, str):
            raise ValueError("message must be a string")
        if state in FINISH_STATES:
            job = self.finish(collection, job_id, state, message)
            with self._lock:
                found = self._find(collection, job_id)
                found.held_progress = copy.deepcopy(progress)
                self._save()
                return self._resource(found, self._now()) if progress is not None else job
        with self._lock:
            job2 = self._find(collection, job_id)
            now = self._now()
            job2.held_state = state
            job2.held_at = now if state is not None else None
            job2.held_progress = copy.deepcopy(progress)
            self._save()
            return self._resource(job2, now)

    def set_resources(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            result = self._resources.update(body)
            self._save()
            return result

    def resources(self) -> dict[str, Any]:
        with self._lock:
            return self._resources.as_json()

    def set_rate_limit(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            result = self._rate.update(body)
            self._save()
            return result

    def rate_limit(self) -> dict[str, Any]:
        with self._lock:
            return self._rate.as_json()

    def set_faults(
        self,
        *,
        error_rate: float = 0.0,
        statuses: Sequence[int] | None = None,
        timeout_rate: float = 0.0,
        latency_ms: int = 0,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        rules: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Replace the fault settings and scripted rules (no arguments clears them all).
        Returns the new settings."""
        faults = Faults.build(
            error_rate=error_rate,
            statuses=statuses,
            timeout_rate=timeout_rate,
            latency_ms=latency_ms,
            timeout_seconds=timeout_seconds,
            rules=rules,
        )
        with self._lock:
            self._faults = faults
            self._save()
            return faults.as_json()

    def faults(self) -> dict[str, Any]:
        with self._lock:
            return self._faults.as_json()

    def requests(self) -> list[dict[str, Any]]:
        """Every Fireworks-path request received so far, oldest first."""
        with self._lock:
            return copy.deepcopy(list(self._requests))

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def jobs(self) -> list[dict[str, Any]]:
        """Every job not deleted, as GET would show it, plus a "sim" object with its
        collection, GPU count and whether it counts in quota usage now."""
        with self._lock:
            now = self._now()
            result = []
            for job in self._jobs.values():
                resource = self._resource(job, now)
                resource["sim"] = {
                    "collection": job.collection,
                    "kind": COLLECTIONS[job.collection][0],
                    "gpuCount": job.gpus,
                    "countsInUsage": resource["state"] not in TERMINAL_STATES
                    and self._age(job, now) >= self._usage_lag,
                }
                result.append(resource)
            return result

    def advance(self, seconds: float) -> float:
        """Move simulated time forward (for demos and e2e runs against a real process)."""
        step = number(seconds, "seconds")
        with self._lock:
            self._offset += step
            self._save()
            return self._offset

    def reset(self) -> None:
        """Back to the constructor's state: no jobs, requests or faults, default quota."""
        with self._lock:
            self._reset_locked()
            self._save()
        self._release_sleepers()

    # -- the state file (store.py) ----------------------------------------------------------

    def _wall(self, at: float | None) -> float | None:
        """A clock reading as wall-clock seconds (the monotonic clock restarts with the process)."""
        return None if at is None else self._epoch + (at - self._t0)

    def _clock_at(self, wall: float | None) -> float | None:
        return None if wall is None else self._t0 + (float(wall) - self._epoch)

    def _save(self) -> None:
        """Write the account to the state file, if there is one (the caller holds the lock)."""
        if self.state_file is None:
            return
        jobs = [
            {
                "collection": job.collection, "job_id": job.job_id, "payload": job.payload,
                "gpus": job.gpus, "created": self._wall(job.created),
                "job_seconds": job.job_seconds, "final_state": job.final_state,
                "final_message": job.final_message, "final_at": self._wall(job.final_at),
                "final_code": job.final_code, "held_state": job.held_state,
                "held_at": self._wall(job.held_at), "held_progress": job.held_progress,
            }
            for job in self._jobs.values()
        ]
        write_state(self.state_file, {
            "account_id": self.account_id,
            "jobs": jobs,
            # Where the simulator's own time stood (its clock, moved by /_sim/advance or a test's
            # fake clock), against the real time it was saved at: the next start carries on
            # from there, plus however long it was down.
            "simulated_now": self._wall(self._now()),
            "saved_at": time.time(),
            "quota": {
                "max_value": self._max_value, "value": self._value,
                "external_usage": self._external_usage, "usage_lag_seconds": self._usage_lag,
                "enforce_quota": self._enforce_quota,
                "over_quota_creates": self._over_quota_creates,
            },
            "resources": self._resources.as_json(),
            "rate_limit": {"rpm": self._rate.rpm},
            "faults": self._faults.as_json(),
        })

    def _restore(self, saved: dict[str, Any]) -> None:
        """The account as `_save` wrote it (the request log and rate window start empty)."""
        with self._lock:
            # Job times are kept as wall-clock seconds; pick the offset that makes this
            # process's "now" the saved one plus the time since it was saved.
            self._epoch = time.time()
            self._t0 = self._clock()
            self._offset = float(saved["simulated_now"]) - float(saved["saved_at"])
            for raw in saved.get("jobs", []):
                job = SimJob(
                    collection=raw["collection"], job_id=raw["job_id"], payload=raw["payload"],
                    gpus=int(raw["gpus"]), created=float(self._clock_at(raw["created"]) or 0.0),
                    job_seconds=float(raw["job_seconds"]), final_state=raw.get("final_state"),
                    final_message=raw.get("final_message"),
                    final_at=self._clock_at(raw.get("final_at")),
                    final_code=raw.get("final_code"), held_state=raw.get("held_state"),
                    held_at=self._clock_at(raw.get("held_at")),
                    held_progress=raw.get("held_progress"),
                )
                self._jobs[(job.collection, job.job_id)] = job
            quota = saved.get("quota") or {}
            self._max_value = int(quota.get("max_value", self._max_value))
            self._value = int(quota.get("value", self._value))
            self._external_usage = quota.get("external_usage", 0)
            self._usage_lag = float(quota.get("usage_lag_seconds", 0.0))
            self._enforce_quota = bool(quota.get("enforce_quota", False))
            self._over_quota_creates = int(quota.get("over_quota_creates", 0))
            resources = saved.get("resources") or {}
            self._resources.update({"known_only": bool(resources.get("known_only", False)),
                                    "resources": resources.get("resources") or {}})
            self._rate.update({"rpm": (saved.get("rate_limit") or {}).get("rpm")})
            faults = dict(saved.get("faults") or {})
            # A scripted rule whose answers are all spent is kept as spent: left out.
            faults["rules"] = [r for r in faults.get("rules") or [] if r.get("times") != 0]
            self._faults = Faults.build(**faults)
