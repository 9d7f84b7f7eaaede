"""What the simulator checks and how it says no: google-style error bodies, Fireworks'
create-time validation, and the small typed parsers the control surface shares."""

from __future__ import annotations

import functools
import json
import string
from pathlib import Path
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


# Fireworks' create bodies, field by field, as its own SDK types them (fireworks-ai's create
# parameters, generated into this JSON file). The file is Fireworks' description of its API, not
# the queue's rules: the queue's pre-flight reads it too, but warns about a field it does not
# list (it may be newer than the file) where Fireworks, and so this simulator, refuses one.
_SCHEMA_FILE = Path(__file__).resolve().parent.parent / "preflight" / "fireworks_schema.json"
# Output-only fields a create body may carry (a resource read back and sent again): Fireworks
# ignores them rather than refusing them.
OUTPUT_ONLY = frozenset({"name", "state", "status", "createTime", "updateTime", "completedTime",
                         "createdBy", "jobProgress", "estimatedCost"})
_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "array": "a list", "object": "an object"}


@functools.cache
def _schemas() -> dict[str, Any]:
    kinds: dict[str, Any] = json.loads(_SCHEMA_FILE.read_text(encoding="utf-8"))["kinds"]
    return kinds


def _of_type(value: object, wanted: str) -> bool:
    if wanted == "string":
        return isinstance(value, str)
    if wanted == "boolean":
        return isinstance(value, bool)
    if wanted == "integer":
        # proto3 JSON: an int64 may travel as a decimal string.
        if isinstance(value, str):
            return value.lstrip("-").isdigit()
        return isinstance(value, int | float) and not isinstance(value, bool) and float(
            value).is_integer()
    if wanted == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if wanted == "array":
        return isinstance(value, list)
    if wanted == "object":
        return isinstance(value, dict)
    return True


def _check_value(node: dict[str, Any], value: object, path: str) -> None:
    wanted = str(node.get("type", "any"))
    if value is None:
        return  # proto3 JSON: null is the field's default
    if not _of_type(value, wanted):
        raise HttpError(400, f"invalid argument: invalid value for {path}: "
                             f"{_TYPE_NAMES.get(wanted, wanted)} is required, got {value!r}")
    if "enum" in node and value not in node["enum"]:
        raise HttpError(400, f"invalid argument: invalid value for enum field {path}: "
                             f"{value!r}")
    if wanted == "object" and "fields" in node:
        assert isinstance(value, dict)
        _check_fields(node, value, path)
    elif wanted == "array" and "items" in node:
        assert isinstance(value, list)
        for i, item in enumerate(value):
            _check_value(node["items"], item, f"{path}[{i}]")


def _check_fields(node: dict[str, Any], body: dict[str, Any], path: str,
                  ignored: frozenset[str] = frozenset()) -> None:
    fields: dict[str, Any] = node["fields"]
    for name, value in body.items():
        where = f"{path}.{name}" if path else name
        if name in fields:
            _check_value(fields[name], value, where)
        elif name not in ignored:
            # grpc-gateway's JSON parsing refuses a field the message does not have.
            raise HttpError(400, f'invalid argument: unknown field "{where}"')


def validate_payload(kind: str, payload: object) -> None:
    """Reject what Fireworks rejects at create time: a field the kind's body does not have (an
    SFT body's flat `baseModel` sent as DPO, say) or of the wrong type, a missing required
    field, and the rules Fireworks states (RFT's responseCandidatesCount >= 2)."""
    if not isinstance(payload, dict):
        raise HttpError(400, "request body must be a JSON object")
    _check_fields(_schemas()[kind], payload, "", ignored=OUTPUT_ONLY)
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
