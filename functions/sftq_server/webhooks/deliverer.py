"""The deliverer: claims due deliveries from the outbox (sql/procedures/120_webhooks.sql),
sends them with bounded concurrency overall and per endpoint, and records each answer; what
happens next to a delivery is decided in SQL (sftq.webhook_record_attempt)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sftq_server.core.errors import SftqError
from sftq_server.webhooks.destinations import (
    BadUrl,
    DestinationRefused,
    Resolver,
    parse_url,
    resolve_checked,
)
from sftq_server.webhooks.secrets import NotConfigured, SecretBox, sign
from sftq_server.webhooks.sender import TIMEOUT_SECONDS, Answer, Connector, connect_tcp, send

if TYPE_CHECKING:
    import ssl

    from sftq_server.core.settings import Settings
    from sftq_server.db import Database

logger = logging.getLogger("sftq.webhooks")

# Deliverer defaults: overall and per-endpoint concurrency, and how long a claim holds a row
# (longer than one attempt can take: the 10 s exchange plus DNS and recording).
DEFAULT_CONCURRENCY = 16
DEFAULT_PER_ENDPOINT = 4
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_POLL_SECONDS = 0.25
RETENTION_DAYS = 30
PRUNE_EVERY_SECONDS = 3600.0


@dataclass(frozen=True)
class Claimed:
    delivery_id: int
    lease_token: str
    endpoint_id: str
    url: str
    secret_sealed: str
    webhook_id: str
    type: str
    body: str
    attempt: int


@dataclass(frozen=True)
class Outcome:
    webhook_id: str
    type: str
    destination: str  # scheme://host[:port], never the path or query
    attempt: int
    status: int | None
    error: str | None
    duration_ms: int
    result: str  # what sftq.webhook_record_attempt answered

    def line(self) -> str:
        answer = str(self.status) if self.status is not None else "no answer"
        text = (f"webhook {self.webhook_id} {self.type} attempt {self.attempt} -> "
                f"{self.destination}: {answer} in {self.duration_ms} ms, {self.result}")
        if self.error:
            text += f" ({self.error})"
        return text


class Deliverer:
    """Claims due deliveries, sends them with bounded concurrency, records each attempt.

    Any number of deliverers (processes, function instances) may run at once and any may die:
    a claim is a lease, so a row whose deliverer vanished is due again when its lease ends.
    At most `per_endpoint` deliveries per endpoint are held at once across all deliverers, and
    at most `concurrency` in this one, so a slow receiver holds a few slots, never all of them.
    """

    def __init__(self, db: Database, settings: Settings, *,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 per_endpoint: int = DEFAULT_PER_ENDPOINT,
                 lease_seconds: float = DEFAULT_LEASE_SECONDS,
                 timeout: float = TIMEOUT_SECONDS,
                 resolver: Resolver | None = None,
                 connector: Connector = connect_tcp,
                 ssl_context: ssl.SSLContext | None = None,
                 on_outcome: Callable[[Outcome], None] | None = None) -> None:
        if concurrency < 1 or per_endpoint < 1:
            raise ValueError("concurrency and per_endpoint must be at least 1")
        if lease_seconds <= timeout + 1:
            raise ValueError("the lease must outlast an attempt: more than timeout + 1 s")
        self.db = db
        self.allow_private = settings.webhooks_allow_private
        self.box = SecretBox.from_settings(settings)
        self.concurrency = concurrency
        self.per_endpoint = per_endpoint
        self.lease_seconds = lease_seconds
        self.timeout = timeout
        self.resolver = resolver
        self.connector = connector
        self.ssl_context = ssl_context
        self.on_outcome = on_outcome
        self._next_prune = 0.0

    # -- one delivery --------------------------------------------------------------------

    def claim(self, limit: int) -> list[Claimed]:
        from sftq_server import db as dbmod

        rows = self.db.fetchall(dbmod.WEBHOOK_CLAIM,
                                (limit, self.per_endpoint, self.lease_seconds))
        return [Claimed(int(r[0]), str(r[1]), str(r[2]), r[3], r[4], r[5], r[6], r[7], int(r[8]))
                for r in rows]

    def attempt(self, row: Claimed) -> Answer:
        """Check the destination, sign, send: what the receiver answered (never raises)."""
        started = time.monotonic()

        def failed(error: str) -> Answer:
            return Answer(None, error, int((time.monotonic() - started) * 1000))

        try:
            target = parse_url(row.url, allow_http=self.allow_private)
            addresses = resolve_checked(target, allow_private=self.allow_private,
                                        resolver=self.resolver)
        except (BadUrl, DestinationRefused) as exc:
            return failed(f"destination refused: {exc}")
        try:
            secret = self.box.open(row.secret_sealed, row.endpoint_id)
        except NotConfigured as exc:
            logger.error("webhook %s: cannot sign: %s", row.webhook_id, exc.message)
            return failed("the server could not sign this delivery (its signing key is not "
                          "configured); it will retry")
        body = row.body.encode()
        # The signing timestamp is the attempt's (receivers reject old ones); webhook-id is the
        # delivery's, the same on every attempt.
        timestamp = int(time.time())
        headers = [("webhook-id", row.webhook_id), ("webhook-timestamp", str(timestamp)),
                   ("webhook-signature", sign(secret, row.webhook_id, timestamp, body))]
        return send(target, addresses, headers, body, timeout=self.timeout,
                    connector=self.connector, ssl_context=self.ssl_context)

    def deliver(self, row: Claimed) -> Outcome:
        from sftq_server import db as dbmod

        attempted_at = time.time()
        try:
            answer = self.attempt(row)
        except Exception:
            # A bug must not leave the row to come back at every lease expiry with nothing
            # recorded: record a failed attempt, so it backs off and shows up in the history.
            logger.exception("webhook %s: the attempt failed unexpectedly", row.webhook_id)
            answer = Answer(None, "internal error while sending; it will be retried",
                            int((time.time() - attempted_at) * 1000))
        result = self.db.scalar(dbmod.WEBHOOK_RECORD_ATTEMPT, (
            row.delivery_id, row.lease_token, answer.status, answer.error, answer.duration_ms,
            attempted_at))
        try:
            destination = parse_url(row.url, allow_http=True).label
        except BadUrl:
            destination = "(invalid url)"
        outcome = Outcome(row.webhook_id, row.type, destination, row.attempt, answer.status,
                          answer.error, answer.duration_ms, str(result))
        logger.info("%s", outcome.line())
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        return outcome

    def _deliver_logged(self, row: Claimed) -> Outcome | None:
        try:
            return self.deliver(row)
        except SftqError as exc:
            # The database went away between send and record: the lease runs out and the row
            # is sent again (at least once; receivers deduplicate by webhook-id).
            logger.warning("webhook %s: could not record the attempt: %s", row.webhook_id,
                           exc.message)
        except Exception:
            logger.exception("webhook %s: delivery failed unexpectedly", row.webhook_id)
        return None

    def prune(self, force: bool = False) -> int:
        from sftq_server import db as dbmod

        now = time.monotonic()
        if not force and now < self._next_prune:
            return 0
        self._next_prune = now + PRUNE_EVERY_SECONDS
        return int(self.db.scalar(dbmod.WEBHOOK_PRUNE, (RETENTION_DAYS,)) or 0)

    # -- loops ---------------------------------------------------------------------------

    def run(self, stop: threading.Event, *, poll_interval: float = DEFAULT_POLL_SECONDS,
            budget_seconds: float | None = None, until_idle: bool = False) -> int:
        """Deliver until `stop` is set, or `budget_seconds` pass, or (`until_idle`) nothing is
        due; then wait for the attempts in flight. Answers how many attempts were made.

        In the endless mode a failed claim (database away) is logged and retried; with
        `until_idle` (one pass of the delivery function) it is raised.
        """
        from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

        ends = None if budget_seconds is None else time.monotonic() + budget_seconds
        made = 0
        inflight: set[Future[Outcome | None]] = set()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="sftq-webhook") as pool:
            while not stop.is_set() and (ends is None or time.monotonic() < ends):
                inflight = {f for f in inflight if not f.done()}
                free = self.concurrency - len(inflight)
                claimed: list[Claimed] = []
                if free > 0:
                    try:
                        claimed = self.claim(free)
                        self.prune()
                    except SftqError as exc:
                        if until_idle:
                            raise
                        logger.warning("webhooks: cannot claim deliveries: %s", exc.message)
                        stop.wait(max(poll_interval, 1.0))
                        continue
                for row in claimed:
                    inflight.add(pool.submit(self._deliver_logged, row))
                made += len(claimed)
                if until_idle and not claimed and not inflight:
                    break
                if claimed and len(claimed) == free:
                    continue  # a full batch: more may be due, claim again at once
                if inflight:
                    # An attempt ending frees a slot (and maybe its endpoint's turn).
                    wait(inflight, timeout=poll_interval, return_when=FIRST_COMPLETED)
                else:
                    stop.wait(poll_interval)
            wait(inflight)
        return made
