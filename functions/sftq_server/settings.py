"""Settings, read once from the environment into one typed object."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if not raw:
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    database_url: str
    # Pool per process: functions are small and many; a few connections each is plenty.
    db_pool_max: int = 4
    # How long a request waits for a connection before answering 503 (never a hang).
    db_timeout_seconds: float = 5.0
    max_body_bytes: int = 1_048_576
    tick_secret: str = ""
    fireworks_base_url: str = "https://api.fireworks.ai"
    fireworks_api_key: str = ""
    fireworks_account_id: str = ""
    fireworks_quota_id: str = "training-h200-count"
    fireworks_timeout_seconds: float = 10.0
    # How long after a create the provider's usage may still not count the job.
    usage_grace_seconds: float = 300.0
    # A tick that dies keeps the lease this long at most.
    tick_lease_seconds: float = 120.0
    # Set (SFTQ_DEV_STACK=1) only by a local development stack: scheduler-tick then accepts a
    # tick secret shorter than 32 characters. Everywhere else a short one stops it starting.
    dev_stack: bool = False
    # How often the scheduler ticks. The API judges a stalled scheduler (no tick for 3 of
    # these) and places estimates on the tick grid with it; `sftq dev` passes its
    # --tick-interval here.
    tick_interval_seconds: float = 30.0
    # GET /capacity names every user with work; false folds the others into one row.
    capacity_show_users: bool = True

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database_url=os.environ.get("DATABASE_URL", ""),
            db_pool_max=_int("SFTQ_DB_POOL_MAX", 4),
            db_timeout_seconds=_float("SFTQ_DB_TIMEOUT_SECONDS", 5.0),
            max_body_bytes=_int("SFTQ_MAX_BODY_BYTES", 1_048_576),
            tick_secret=os.environ.get("SFTQ_TICK_SECRET", ""),
            fireworks_base_url=os.environ.get("FIREWORKS_BASE_URL", "https://api.fireworks.ai"),
            fireworks_api_key=os.environ.get("FIREWORKS_API_KEY", ""),
            fireworks_account_id=os.environ.get("FIREWORKS_ACCOUNT_ID", ""),
            fireworks_quota_id=os.environ.get("FIREWORKS_QUOTA_ID", "training-h200-count"),
            fireworks_timeout_seconds=_float("FIREWORKS_TIMEOUT", 10.0),
            usage_grace_seconds=_float("SFTQ_USAGE_GRACE_SECONDS", 300.0),
            tick_lease_seconds=_float("SFTQ_TICK_LEASE_SECONDS", 120.0),
            dev_stack=os.environ.get("SFTQ_DEV_STACK", "") == "1",
            tick_interval_seconds=_float("SFTQ_TICK_INTERVAL_SECONDS", 30.0),
            capacity_show_users=_bool("SFTQ_CAPACITY_SHOW_USERS", True),
        )


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings.from_env()
