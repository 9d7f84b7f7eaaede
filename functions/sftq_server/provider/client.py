"""The Fireworks control-plane client: fine-tuning jobs, the resources a payload names, and
the training GPU quota (see the package docstring for what it does and does not do)."""

from __future__ import annotations

import functools
import json
import logging
import os
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import httpx

from sftq_server.provider.budget import CallBudget
from sftq_server.provider.errors import (
    AlreadyExists,
    AuthError,
    BudgetSpent,
    NotFound,
    ProviderError,
    RateLimited,
    Rejected,
    Transient,
    http_reason,
    parse_error_code,
    parse_error_message,
    parse_retry_after,
)
from sftq_server.provider.models import ProviderJob, Quota
from sftq_server.provider.names import (
    ID_PARAM,
    KIND_COLLECTION,
    check_id,
    check_kind,
    full_resource_name,
    resource_match,
    segment,
)

logger = logging.getLogger("sftq_server.provider")

DEFAULT_BASE_URL = "https://api.fireworks.ai"
DEFAULT_QUOTA_ID = "training-h200-count"
DEFAULT_TIMEOUT = 10.0
# Fireworks' account-wide request rate is 10 to 6,000 requests a minute (6,000 by default);
# each client paces its own calls to FIREWORKS_RPM.
DEFAULT_RPM = 6000
# A 429 without Retry-After: the client sends nothing for this long.
DEFAULT_RATE_LIMIT_SECONDS = 5.0
# ... and a Retry-After beyond this is taken as this (a broken header must not stop us for days).
MAX_RETRY_AFTER_SECONDS = 900.0


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Building httpx's default context (loading the CA bundle) costs ~70 ms; every client in
    # the process shares one, which matters for cold starts and for per-tick clients.
    return httpx.create_ssl_context()



class FireworksClient:
    """A small synchronous Fireworks client for the scheduler.

    Every request carries the client timeout. Errors are raised as `ProviderError` subclasses;
    nothing is retried here. The API key lives only in the transport's headers: it is kept out
    of reprs, exception messages and log lines.
    """

    def __init__(
        self,
        *,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str,
        account_id: str,
        quota_id: str = DEFAULT_QUOTA_ID,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
        rpm: int = DEFAULT_RPM,
        budget: CallBudget | None = None,
    ) -> None:
        if not api_key:
            raise ValueError("a Fireworks API key is required")
        if not account_id:
            raise ValueError("a Fireworks account id is required")
        self.base_url = base_url.rstrip("/")
        self.account_id = account_id
        self.quota_id = quota_id
        self.timeout = timeout
        if not 1 <= rpm <= 1_000_000:
            raise ValueError("rpm (FIREWORKS_RPM) must be a whole number of requests a minute")
        self.rpm = rpm
        # The deployment's one budget (sftq_server.budget.DbBudget), when it has one: every
        # call asks it for a slot, and a 429 holds every process. Without it, local pacing.
        self.budget = budget
        # Pacing: calls start at least this far apart; a 429's Retry-After holds every call.
        self._interval = 60.0 / rpm
        self._next_send = 0.0
        self._quiet_until = 0.0
        self._pace_lock = threading.Lock()
        self.calls_made = 0
        # Calls by (call, status): the tick records its share (sftq_provider_requests_total).
        self.call_counts: dict[tuple[str, str], int] = {}
        self._count_lock = threading.Lock()
        self._api_key = api_key
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": "finetune-queue",
            },
            timeout=httpx.Timeout(timeout),
            transport=transport,
            verify=_ssl_context(),
            # A redirect would mean a wrong base URL; surface it instead of following it.
            follow_redirects=False,
        )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> FireworksClient:
        """Build a client from FIREWORKS_API_KEY, FIREWORKS_ACCOUNT_ID and the optional
        FIREWORKS_BASE_URL, FIREWORKS_QUOTA_ID and FIREWORKS_TIMEOUT."""
        env = os.environ if environ is None else environ
        api_key = env.get("FIREWORKS_API_KEY", "")
        account_id = env.get("FIREWORKS_ACCOUNT_ID", "")
        if not api_key:
            raise ValueError("FIREWORKS_API_KEY is not set")
        if not account_id:
            raise ValueError("FIREWORKS_ACCOUNT_ID is not set")
        raw_timeout = env.get("FIREWORKS_TIMEOUT") or str(DEFAULT_TIMEOUT)
        try:
            timeout = float(raw_timeout)
        except ValueError:
            raise ValueError(f"FIREWORKS_TIMEOUT is not a number: {raw_timeout!r}") from None
        if not timeout > 0:
            raise ValueError("FIREWORKS_TIMEOUT must be positive")
        raw_rpm = env.get("FIREWORKS_RPM") or str(DEFAULT_RPM)
        try:
            rpm = int(raw_rpm)
        except ValueError:
            raise ValueError(f"FIREWORKS_RPM is not a whole number: {raw_rpm!r}") from None
        return cls(
            base_url=env.get("FIREWORKS_BASE_URL") or DEFAULT_BASE_URL,
            api_key=api_key,
            account_id=account_id,
            quota_id=env.get("FIREWORKS_QUOTA_ID") or DEFAULT_QUOTA_ID,
            timeout=timeout,
            transport=transport,
            rpm=rpm,
        )

    def __repr__(self) -> str:
        return (
            f"FireworksClient(base_url={self.base_url!r}, account_id={self.account_id!r}, "
            f"quota_id={self.quota_id!r})"
        )

    def __enter__(self) -> FireworksClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- jobs -------------------------------------------------------------------------------

    def create_job(
        self,
        kind: str,
        job_id: str,
        payload: dict[str, Any],
        *,
        gpu_count: int | None = None,
    ) -> ProviderJob:
        """Create a job with our chosen id. A repeat raises `AlreadyExists` (409).

        `gpu_count` travels as X-Sftq-Gpu-Count: the simulator sizes the job by it, and
        Fireworks ignores headers it does not know.
        """
        collection = check_kind(kind)
        check_id(job_id)
        headers = {"X-Sftq-Gpu-Count": str(int(gpu_count))} if gpu_count is not None else None
        data = self._request(
            "POST",
            f"{self._account_path}/{collection}",
            call="create_job",
            op="create",
            params={ID_PARAM[kind]: job_id},
            json_body=payload,
            headers=headers,
        )
        return ProviderJob.from_resource(kind, data, job_id)

    def get_job(self, kind: str, job_id: str) -> ProviderJob:
        collection = check_kind(kind)
        path = f"{self._account_path}/{collection}/{segment(check_id(job_id))}"
        data = self._request("GET", path, call="get_job")
        return ProviderJob.from_resource(kind, data, job_id)

    def list_jobs(self, kind: str, *, page_size: int = 200) -> Iterator[ProviderJob]:
        """Every job of one kind, following nextPageToken (pages are fetched lazily)."""
        collection = check_kind(kind)
        if not 1 <= page_size <= 200:
            raise ValueError("page_size must be between 1 and 200")
        token: str | None = None
        seen_tokens: set[str] = set()
        while True:
            params = {"pageSize": str(page_size)}
            if token:
                params["pageToken"] = token
            data = self._request("GET", f"{self._account_path}/{collection}", params=params,
                                 call="list_jobs")
            items = data.get(collection) or []
            if not isinstance(items, list):
                raise ProviderError(f"list {collection}: {collection!r} is not a list")
            for item in items:
                if isinstance(item, dict):
                    yield ProviderJob.from_resource(kind, item)
            next_token = data.get("nextPageToken")
            if not isinstance(next_token, str) or not next_token:
                return
            if next_token in seen_tokens:
                # A server handing back a token it already gave would loop us forever.
                raise ProviderError(f"list {collection}: page token repeated")
            seen_tokens.add(next_token)
            token = next_token

    def delete_job(self, kind: str, job_id: str) -> None:
        """DELETE an SFT or DPO job (Fireworks removes the resource; a later GET is 404)."""
        collection = check_kind(kind)
        if kind == "RFT":
            raise ValueError("RFT jobs are stopped with cancel_job, not deleted")
        self._request("DELETE", f"{self._account_path}/{collection}/{segment(check_id(job_id))}",
                      call="delete_job")

    def cancel_job(self, kind: str, job_id: str) -> None:
        """POST :cancel to an RFT job (the resource stays, in JOB_STATE_CANCELLED)."""
        collection = check_kind(kind)
        if kind != "RFT":
            raise ValueError("only RFT jobs have :cancel here; SFT and DPO are deleted")
        self._request(
            "POST",
            f"{self._account_path}/{collection}/{segment(check_id(job_id))}:cancel",
            call="cancel_job",
            json_body={},
        )

    def stop_job(self, kind: str, job_id: str) -> str:
        """Stop a job the way its kind is stopped; returns "delete" or "cancel".

        A 404 means it is gone already (deleted by us on an earlier try, or externally), which
        is what stopping wants, so it does not raise.
        """
        action = "cancel" if kind == "RFT" else "delete"
        try:
            if action == "cancel":
                self.cancel_job(kind, job_id)
            else:
                self.delete_job(kind, job_id)
        except NotFound:
            logger.info("fireworks %s %s/%s: already gone (404)", action, kind, job_id)
        return action

    # -- the resources a job names (pre-flight) --------------------------------------------

    def resource_name(self, kind: str, ref: str) -> str | None:
        """The full name of a dataset, model or evaluator a payload refers to, or None when
        the reference is not one the API could address. A bare id is this account's."""
        return full_resource_name(kind, ref, self.account_id)

    def get_resource(self, name: str, *, timeout: float | None = None) -> dict[str, Any]:
        """GET one dataset, model or evaluator by its full name (any account's: the public
        models live under accounts/fireworks). `NotFound` when it does not exist. The name
        is matched whole and each of its segments percent-encoded into the path."""
        match = resource_match(name)
        if not match:
            raise ValueError(f"not a dataset, model or evaluator name: {name!r}")
        account, collection, rid = match.groups()
        call = "get_" + collection.removesuffix("s")
        return self._request("GET", f"/v1/accounts/{segment(account)}/{collection}/{segment(rid)}",
                             call=call, timeout=timeout)

    def estimate_cost(self, kind: str, payload: dict[str, Any], *, gpu_count: int | None = None,
                      timeout: float | None = None) -> Any:
        """What Fireworks estimates an SFT job would cost (`estimatedCost`, a google.type.Money
        as sent), from the same body as the create; None when it gives no figure.

        *Unconfirmed*: the route is `POST .../supervisedFineTuningJobs:estimateCost`; the
        simulator serves it. A 404 or 501 (no such route) answers None, like no figure."""
        if kind != "SFT":
            return None
        headers = {"X-Sftq-Gpu-Count": str(int(gpu_count))} if gpu_count is not None else None
        try:
            data = self._request(
                "POST", f"{self._account_path}/{KIND_COLLECTION[kind]}:estimateCost",
                call="estimate_cost", json_body=payload, headers=headers, timeout=timeout)
        except (NotFound, Rejected) as exc:
            if exc.status in (404, 405, 501):
                return None
            raise
        return data.get("estimatedCost")

    # -- quota ------------------------------------------------------------------------------

    def get_quota(self) -> Quota:
        data = self._request("GET", f"{self._account_path}/quotas/{segment(self.quota_id)}",
                             call="get_quota")
        return Quota.from_resource(data)

    def list_quotas(self, *, page_size: int = 200) -> Iterator[Quota]:
        """Every quota of the account, following nextPageToken."""
        if not 1 <= page_size <= 200:
            raise ValueError("page_size must be between 1 and 200")
        token: str | None = None
        while True:
            params = {"pageSize": str(page_size)}
            if token:
                params["pageToken"] = token
            data = self._request("GET", f"{self._account_path}/quotas", params=params,
                                 call="list_quotas")
            for item in data.get("quotas") or []:
                if isinstance(item, dict):
                    yield Quota.from_resource(item)
            next_token = data.get("nextPageToken")
            if not isinstance(next_token, str) or not next_token or next_token == token:
                return
            token = next_token

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _account_path(self) -> str:
        return f"/v1/accounts/{segment(self.account_id)}"

    def _take(self, call: str, what: str) -> float | None:
        """The budget's slot for this call (sleeping up to its max_wait for one); None when
        the call may go, or the seconds a shared 429 hold still runs. Raises BudgetSpent
        (nothing sent) when the caller's share is spent."""
        budget = self.budget
        assert budget is not None
        with self._pace_lock:
            local = self._quiet_until - time.monotonic()
        if local > 0:
            self._budget_done(call, "not_sent")
            return local
        deadline = time.monotonic() + max(0.0, budget.max_wait)
        while True:
            try:
                grant = budget.take(call)
            except Exception as exc:  # noqa: BLE001 - the budget itself failed
                # A budget that cannot answer must not stop the scheduler: it paces itself to
                # FIREWORKS_RPM as it did before there was one (a lookup's budget answers
                # "no" instead, and the lookup is left to the scheduler).
                logger.warning("provider budget failed (%s): pacing locally", exc)
                return self._pace()
            if grant.ok:
                return None
            if grant.hold > 0:
                self._hold(grant.hold)
                return grant.hold
            left = deadline - time.monotonic()
            if grant.wait <= 0 or grant.wait > left:
                self._count(call, "over_budget")
                raise BudgetSpent(
                    f"{what}: not sent: the deployment's provider budget is spent for now "
                    f"({grant.why or 'FIREWORKS_RPM'}; a slot frees in about "
                    f"{max(grant.wait, 0.0):.0f} s)")
            time.sleep(grant.wait)

    def _share_hold(self, retry_after: float | None) -> None:
        seconds = DEFAULT_RATE_LIMIT_SECONDS if retry_after is None else retry_after
        try:
            assert self.budget is not None
            self.budget.hold(min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS))
        except Exception as exc:  # noqa: BLE001 - the local hold still holds this process
            logger.warning("could not share the provider's 429 hold: %s", exc)

    def _budget_done(self, call: str, label: str) -> None:
        try:
            assert self.budget is not None
            self.budget.done(call, label)
        except Exception as exc:  # noqa: BLE001 - a metric lost, never a call
            logger.warning("could not record a provider call: %s", exc)

    def _pace(self) -> float | None:
        """Wait for this call's turn under FIREWORKS_RPM; None when it may go, or the seconds
        an earlier 429's Retry-After still holds every call (the call is then not sent)."""
        with self._pace_lock:
            now = time.monotonic()
            if now < self._quiet_until:
                return self._quiet_until - now
            start = max(now, self._next_send)
            self._next_send = start + self._interval
        if start > now:
            time.sleep(start - now)
        return None

    def _hold(self, retry_after: float | None) -> None:
        seconds = DEFAULT_RATE_LIMIT_SECONDS if retry_after is None else retry_after
        seconds = min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)
        with self._pace_lock:
            self._quiet_until = max(self._quiet_until, time.monotonic() + seconds)

    @property
    def quiet_for(self) -> float:
        """Seconds an earlier 429's Retry-After still holds every call (0: none)."""
        with self._pace_lock:
            return max(0.0, self._quiet_until - time.monotonic())

    def _redact(self, text: str) -> str:
        # Fireworks never echoes the key, but a proxy or a debugging server might; keys shorter
        # than 6 characters are not real keys and replacing them would mangle the text.
        if len(self._api_key) >= 6 and self._api_key in text:
            return text.replace(self._api_key, "[redacted]")
        return text

    def _request(
        self,
        method: str,
        path: str,
        *,
        call: str = "other",
        op: str = "read",
        params: Mapping[str, str] | None = None,
        json_body: object = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        what = f"{method} {path}"
        wait = self._pace() if self.budget is None else self._take(call, what)
        if wait is not None:
            # Not sent: the provider asked us to hold off (Retry-After), and this call comes
            # before that time. Counted as "not_sent", never as a provider call.
            self._count(call, "not_sent")
            raise RateLimited(f"{what}: not sent: the provider asked us to wait, "
                              f"{wait:.1f} s more (Retry-After)", retry_after=wait)
        with self._count_lock:
            self.calls_made += 1
        # The status label: the HTTP status, else "timeout" or "error" (no answer at all).
        label = "error"
        try:
            status, data = self._send(method, path, op, params, json_body, headers, timeout)
            label = str(status)
            return data
        except ProviderError as exc:
            # Over the request rate: hold every call for Retry-After. An over-quota create
            # (quota_exceeded) without one says nothing about the rate.
            if isinstance(exc, RateLimited) and exc.status == 429 and (
                    exc.retry_after is not None or "quota_exceeded" not in exc.body):
                self._hold(exc.retry_after)
                if self.budget is not None:
                    self._share_hold(exc.retry_after)
            if exc.status is not None:
                label = str(exc.status)
            elif isinstance(exc.__cause__, httpx.TimeoutException):
                label = "timeout"
            raise
        finally:
            self._count(call, label)
            if self.budget is not None:
                self._budget_done(call, label)

    def _count(self, call: str, label: str) -> None:
        with self._count_lock:
            self.call_counts[(call, label)] = self.call_counts.get((call, label), 0) + 1

    def _send(
        self,
        method: str,
        path: str,
        op: str,
        params: Mapping[str, str] | None,
        json_body: object,
        headers: Mapping[str, str] | None,
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        started = time.monotonic()
        what = f"{method} {path}"
        try:
            response = self._http.request(
                method,
                path,
                params=params,
                json=json_body if method in ("POST", "PATCH", "PUT") else None,
                headers=headers,
                timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.TimeoutException as exc:
            logger.debug("fireworks %s: timed out after %.3fs", what, time.monotonic() - started)
            raise Transient(f"{what}: timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            logger.debug("fireworks %s: %s", what, type(exc).__name__)
            raise Transient(
                f"{what}: connection failed ({type(exc).__name__}: {self._redact(str(exc))})"
            ) from exc
        elapsed_ms = (time.monotonic() - started) * 1000
        logger.debug("fireworks %s -> %d in %.1f ms", what, response.status_code, elapsed_ms)
        status = response.status_code
        text = self._redact(response.text)
        if 200 <= status < 300:
            if not text.strip():
                return status, {}
            try:
                data = json.loads(text)
            except ValueError:
                # A 2xx we cannot read (an HTML page from a proxy, say): the call may or may not
                # have taken effect, and only a retry that re-reads can tell.
                raise Transient(
                    f"{what}: unreadable response body", status=status, body=text
                ) from None
            if not isinstance(data, dict):
                raise Transient(f"{what}: response is not a JSON object", status=status, body=text)
            return status, data
        raise self._error(what, op, status, text, response.headers.get("Retry-After"))

    def _error(
        self, what: str, op: str, status: int, body: str, retry_after: str | None
    ) -> ProviderError:
        parsed = parse_error_message(body)
        detail = parsed if parsed is not None else (body[:200] or http_reason(status))
        message = f"{what}: HTTP {status}: {detail}"
        if status in (408, 429) or 500 <= status <= 599:
            return (RateLimited if status == 429 else Transient)(
                message,
                status=status,
                body=body,
                provider_message=parsed,
                retry_after=parse_retry_after(retry_after),
            )
        if status == 409:
            # Only ALREADY_EXISTS means "our earlier create landed". ABORTED (a concurrency
            # conflict) and any 409 we cannot read are worth a retry, never an adoption: the
            # job may not exist at all.
            code = parse_error_code(body)
            if code == "ALREADY_EXISTS" or (
                code is None and "already exists" in (parsed or body).lower()
            ):
                return AlreadyExists(message, status=status, body=body, provider_message=parsed)
            return Transient(message, status=status, body=body, provider_message=parsed)
        if status == 404 and op != "create":
            return NotFound(message, status=status, body=body, provider_message=parsed)
        if status in (401, 403):
            return AuthError(message, status=status, body=body, provider_message=parsed)
        if 400 <= status <= 499:
            # Including a 404 on create: a referenced model or dataset that does not exist.
            return Rejected(message, status=status, body=body, provider_message=parsed)
        return ProviderError(message, status=status, body=body, provider_message=parsed)

