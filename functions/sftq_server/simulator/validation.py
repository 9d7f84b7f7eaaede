"""What the simulator checks and how it says no: google-style error bodies, Fireworks'
create-time validation, and the small typed parsers the control surface shares."""

from __future__ import annotations

import string
from typing import Any

# The google.rpc status each HTTP status stands for in an error body.
RPC_CODES: dict[int, tuple[int, str]] = {
    400: (3, "INVALID_ARGUMENT"),
    401: (16, "UNAUTHENTICATED"),
    403: (7, "PERMISSION_DENIED"),
    404: (5, "NOT_FOUND"),
    405: (12, "UNIMPLEMENTED"),
    408: (4, "DEADLINE_EXCEEDED"),
    409: (6, "ALREADY_EXISTS"),
    429: (8, "RESOURCE_EXHAUSTED"),
    500: (13, "INTERNAL"),
    502: (14, "UNAVAILABLE"),
    503: (14, "UNAVAILABLE"),
    504: (4, "DEADLINE_EXCEEDED"),
}

DEFAULT_GPUS = 4
_ID_CHARS = frozenset(string.ascii_lowercase + string.digits + "-")


class HttpError(Exception):
    """An error answer: an HTTP status with a google-style body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict[str, Any]:
    code = RPC_CODES.get(status, (2, "UNKNOWN"))[0]
    return {"code": code, "message": message, "details": []}


def valid_id(value: str) -> bool:
    return (
        0 < len(value) <= 63
        and set(value) <= _ID_CHARS
        and not value.startswith("-")
        and not value.endswith("-")
    )


def number(value: object, field: str, *, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ValueError(f"{field} must be a number >= {minimum:g}")
    return float(value)


def integer(value: object, field: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}")
    return value


def rate(value: object, field: str) -> float:
    result = number(value, field)
    if result > 1:
        raise ValueError(f"{field} must be between 0 and 1")
    return result


def positive_int(value: object) -> int | None:
    """A count hint as an int, or None when it is absent or not a positive integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


def _training(payload: dict[str, Any]) -> dict[str, Any]:
    training = payload.get("trainingConfig")
    return training if isinstance(training, dict) else {}


def job_gpus(payload: dict[str, Any], header: str | None) -> int:
    """The GPUs a simulated job holds while it runs.

    The X-Sftq-Gpu-Count header (sent by our provider client) wins; otherwise the payload's
    own hints, `acceleratorCount` (top level or in `trainingConfig`) times the node count
    (`nodeCount` or SFT's `nodes` at top level, or `trainingConfig.nodeCount`; default 1);
    otherwise 4, the contract's default gpu_count.
    """
    from_header = positive_int(header.strip()) if header is not None else None
    if from_header is not None:
        return from_header
    training = _training(payload)
    accelerators = positive_int(payload.get("acceleratorCount")) or positive_int(
        training.get("acceleratorCount")
    )
    if accelerators is None:
        return DEFAULT_GPUS
    nodes = (
        positive_int(payload.get("nodeCount"))
        or positive_int(payload.get("nodes"))
        or positive_int(training.get("nodeCount"))
    )
    return accelerators * (nodes or 1)


def job_epochs(payload: dict[str, Any]) -> int:
    """Epochs the payload asks for: SFT's flat `epochs`, DPO's and RFT's
    `trainingConfig.epochs`; 1 when neither is given."""
    flat = positive_int(payload.get("epochs"))
    return flat or positive_int(_training(payload).get("epochs")) or 1


def validate_payload(kind: str, payload: object) -> None:
    """Reject what Fireworks rejects at create time (a subset: the required fields)."""
    if not isinstance(payload, dict):
        raise HttpError(400, "request body must be a JSON object")
    required = ("dataset", "evaluator") if kind == "RFT" else ("dataset",)
    for field in required:
        value = payload.get(field)
        if not isinstance(value, str) or not value:
            raise HttpError(400, f'invalid argument: field "{field}" is required')
    if kind == "RFT":
        params = payload.get("inferenceParameters")
        count = params.get("responseCandidatesCount") if isinstance(params, dict) else None
        parsed = positive_int(count)
        if parsed is None or parsed < 2:
            raise HttpError(
                400,
                "invalid argument: inferenceParameters.responseCandidatesCount must be >= 2 "
                f"for reinforcement fine-tuning, got {count!r}",
            )
