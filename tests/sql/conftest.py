from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

T0 = datetime(2026, 5, 1, 10, 0, 0, tzinfo=UTC)


class Q:
    """Small helpers over one autocommit connection, each a call of one procedure."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def one(self, sql: str, *params: Any) -> Any:
        row = self.conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    def all(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def user(self, name: str, cap: int = 1) -> int:
        return int(self.one("SELECT sftq.create_user(%s, %s)", name, cap))

    def enqueue(
        self,
        user: int,
        kind: str = "SFT",
        gpus: int = 4,
        *,
        payload: dict[str, Any] | None = None,
        name: str | None = None,
        key: str | None = None,
        at: datetime | None = None,
    ) -> UUID:
        row = self.conn.execute(
            "SELECT id FROM sftq.enqueue(%s, %s, %s::jsonb, %s, %s, %s, %s)",
            (
                user,
                kind,
                json.dumps(payload if payload is not None else {"dataset": "d"}),
                name,
                gpus,
                key,
                at,
            ),
        ).fetchone()
        assert row is not None
        return UUID(str(row[0]))

    def admit(self, gpus: int, at: datetime | None = None) -> list[UUID]:
        rows = self.all("SELECT job_id FROM sftq.admit(%s, COALESCE(%s, now()))", gpus, at)
        return [UUID(str(r[0])) for r in rows]

    def state(self, job: UUID) -> str:
        return str(self.one("SELECT state FROM sftq.jobs WHERE id = %s", job))

    def job(self, job: UUID) -> dict[str, Any]:
        cur = self.conn.execute("SELECT * FROM sftq.jobs WHERE id = %s", (job,))
        row = cur.fetchone()
        assert row is not None and cur.description is not None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}

    def submitted(
        self, job: UUID, state: str = "JOB_STATE_RUNNING", at: datetime | None = None
    ) -> str:
        return str(
            self.one(
                "SELECT sftq.record_submitted(%s, %s, %s, false, COALESCE(%s, now()))",
                job,
                f"accounts/a/supervisedFineTuningJobs/sftq-{job.hex}",
                state,
                at,
            )
        )

    def provider_state(
        self, job: UUID, state: str, message: str | None = None, at: datetime | None = None
    ) -> str:
        return str(
            self.one(
                "SELECT sftq.record_provider_state(%s, %s, %s, COALESCE(%s, now()))",
                job,
                state,
                message,
                at,
            )
        )

    def events(self, job: UUID) -> list[tuple[str, str | None, str | None]]:
        return [
            (r[0], r[1], r[2])
            for r in self.all(
                "SELECT event, from_state, to_state FROM sftq.job_events WHERE job_id = %s ORDER BY id",
                job,
            )
        ]


@pytest.fixture
def q(conn: psycopg.Connection[Any]) -> Q:
    return Q(conn)


def check_code(exc_info: pytest.ExceptionInfo[psycopg.Error], code: str) -> None:
    assert exc_info.value.sqlstate == code, (exc_info.value.sqlstate, str(exc_info.value))


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# Users whose maintained counters disagree with their jobs (should always be none).
COUNTER_DRIFT = """
SELECT u.name FROM sftq.users u
  LEFT JOIN (SELECT user_id,
                    count(*) FILTER (WHERE state = 'QUEUED') AS queued,
                    count(*) FILTER (WHERE state = 'PROGRESS') AS running,
                    count(*) FILTER (WHERE state = 'SUCCESS') AS succeeded,
                    count(*) FILTER (WHERE state = 'FAIL') AS failed,
                    count(*) FILTER (WHERE state = 'CANCELLED') AS cancelled,
                    count(*) FILTER (WHERE kind = 'SFT') AS sft,
                    count(*) FILTER (WHERE kind = 'DPO') AS dpo,
                    count(*) FILTER (WHERE kind = 'RFT') AS rft,
                    COALESCE(sum(gpu_count * extract(epoch FROM completed_at - started_at))
                             FILTER (WHERE state = 'SUCCESS'), 0) AS gpu_seconds
               FROM sftq.jobs GROUP BY user_id) j ON j.user_id = u.id
 WHERE (u.queued_count, u.running_count, u.succeeded_count, u.failed_count, u.cancelled_count,
        u.sft_count, u.dpo_count, u.rft_count, u.success_gpu_seconds)
       IS DISTINCT FROM
       (COALESCE(j.queued, 0), COALESCE(j.running, 0), COALESCE(j.succeeded, 0),
        COALESCE(j.failed, 0), COALESCE(j.cancelled, 0), COALESCE(j.sft, 0), COALESCE(j.dpo, 0),
        COALESCE(j.rft, 0), COALESCE(j.gpu_seconds, 0))
"""
