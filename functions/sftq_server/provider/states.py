"""Fireworks job states and what they mean for our jobs (terminal outcome or still running)."""

from __future__ import annotations

import logging
from typing import Literal

logger = logging.getLogger("sftq_server.provider")

ProviderOutcome = Literal["SUCCESS", "FAIL", "CANCELLED"]

_TERMINAL: dict[str, ProviderOutcome] = {
    "COMPLETED": "SUCCESS",
    "FAILED": "FAIL",
    "EXPIRED": "FAIL",
    "EARLY_STOPPED": "FAIL",
    "CANCELLED": "CANCELLED",
    "DELETED": "CANCELLED",
}
# States Fireworks documents as non-terminal; anything outside both sets is logged once.
_RUNNING = frozenset(
    {
        "UNSPECIFIED",
        "CREATING",
        "PENDING",
        "VALIDATING",
        "RUNNING",
        "WRITING_RESULTS",
        "CANCELLING",
        "DELETING",
        "DELETING_CLEANING_UP",
        "PAUSED",
        "RE_QUEUEING",
        "CREATING_INPUT_DATASET",
        "IDLE",
    }
)
_unknown_states_logged: set[str] = set()


def normalize_state(state: str | None) -> str | None:
    """A provider state in one spelling: upper case with the JOB_STATE_ prefix.

    Fireworks documents prefixed names; some answers (and older SDKs) use the bare ones
    (`COMPLETED`). sftq.map_provider_state in SQL spells the same rule; a test holds the
    two to each other.
    """
    if not state or not state.strip():
        return None
    short = state.strip().upper().removeprefix("JOB_STATE_")
    return "JOB_STATE_" + short


def is_known_state(state: str | None) -> bool:
    normalized = normalize_state(state)
    if normalized is None:
        return False
    short = normalized.removeprefix("JOB_STATE_")
    return short in _TERMINAL or short in _RUNNING


def map_provider_state(state: str | None) -> ProviderOutcome | None:
    """Map a Fireworks job state to our terminal state, or None while it is still running.

    With or without the JOB_STATE_ prefix. PAUSED is not terminal (it can be resumed). An
    unknown state is treated as running, so a state Fireworks adds later can never fail or
    cancel a job by accident; it is logged once per process here (the scheduler also logs
    it once per job).
    """
    normalized = normalize_state(state)
    if normalized is None:
        return None
    short = normalized.removeprefix("JOB_STATE_")
    outcome = _TERMINAL.get(short)
    if outcome is None and short not in _RUNNING and normalized not in _unknown_states_logged:
        _unknown_states_logged.add(normalized)
        logger.warning("unknown Fireworks job state %r: treating it as still running", state)
    return outcome

