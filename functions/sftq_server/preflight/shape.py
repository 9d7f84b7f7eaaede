"""The shape check: a fireworks_payload against Fireworks' create schema for its kind.

Two kinds of finding. A definite one (a wrong type, a missing required field, a misspelled
field that is close to a known one, a rule Fireworks states) would fail the job at submission
for certain: POST /jobs answers 400 `invalid_fireworks_payload` before the job waits. A doubtful
one (a field our copy of the schema does not know, an enum value it does not list) may be newer
than our schema: the job is accepted and the finding comes back in `warnings`.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from sftq_server.preflight.schema import schema_version, schemas
from sftq_server.provider.names import resource_name_problem

_PYTHON_TYPES: dict[str, str] = {"str": "a string", "int": "an integer", "float": "a number",
                                 "bool": "a boolean", "list": "an array", "dict": "an object",
                                 "NoneType": "null"}
# Where each kind names its resources: (path in the payload, collection). The names are
# checked here (a definite error: no valid name, no URL), looked up in `resources`.
REFS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "SFT": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("baseModel",), "models"), (("warmStartFrom",), "models")),
    "DPO": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("trainingConfig", "baseModel"), "models"),
            (("trainingConfig", "warmStartFrom"), "models")),
    "RFT": ((("dataset",), "datasets"), (("evaluationDataset",), "datasets"),
            (("evaluator",), "evaluators"),
            (("trainingConfig", "baseModel"), "models"),
            (("trainingConfig", "warmStartFrom"), "models")),
}
_WANTED = {"string": "a string", "integer": "an integer", "number": "a number",
           "boolean": "true or false", "array": "an array", "object": "an object"}


@dataclass(frozen=True)
class Finding:
    path: str      # where, as fireworks_payload.a.b[2].c
    message: str   # what is wrong and what to do

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


def findings_json(findings: list[Finding]) -> str | None:
    """Findings as the JSON array text a procedure takes; None for none (SQL NULL)."""
    return json.dumps([f.as_json() for f in findings], ensure_ascii=False) if findings else None


@dataclass
class ShapeReport:
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)


def check_shape(kind: str, payload: dict[str, Any]) -> ShapeReport:
    report = ShapeReport()
    root = schemas()[kind]
    _object(report, kind, root, payload, "fireworks_payload")
    _rules(report, kind, payload)
    _names(report, kind, payload)
    return report


def _names(report: ShapeReport, kind: str, payload: dict[str, Any]) -> None:
    """Each dataset, model and evaluator reference must be a valid resource name: one that
    is not (a control character, a '%', '/', '?', '#', '..', a non-ASCII letter, too long)
    could never name a resource, and must never reach a URL."""
    for keys, collection in REFS.get(kind, ()):
        value: Any = payload
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        problem = resource_name_problem(collection, value)
        if problem is not None:
            path = "fireworks_payload." + ".".join(keys)
            report.errors.append(Finding(path, f"{path} {problem}"))


def _is(value: Any, wanted: str) -> bool:
    if wanted == "any":
        return True
    if wanted == "string":
        return isinstance(value, str)
    if wanted == "boolean":
        return isinstance(value, bool)
    if wanted == "integer":
        # Fireworks' JSON mapping takes an int64 as a number or as a decimal string.
        if isinstance(value, str):
            return value.lstrip("-").isdigit()
        return isinstance(value, int | float) and not isinstance(value, bool) \
            and float(value).is_integer()
    if wanted == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if wanted == "array":
        return isinstance(value, list)
    if wanted == "object":
        return isinstance(value, dict)
    return True


def _node(report: ShapeReport, kind: str, node: dict[str, Any], value: Any, path: str) -> None:
    wanted = node["type"]
    if not _is(value, wanted):
        got = _PYTHON_TYPES.get(type(value).__name__, type(value).__name__)
        report.errors.append(Finding(path, f"{path} must be {_WANTED.get(wanted, wanted)}, "
                                           f"not {got}"))
        return
    if "enum" in node and value not in node["enum"]:
        close = difflib.get_close_matches(str(value), node["enum"], n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        report.warnings.append(Finding(path, f"{path} is {value!r}, not a value Fireworks' "
                                             f"schema lists{hint}; sent as is"))
    if wanted == "object" and "fields" in node:
        _object(report, kind, node, value, path)
    elif wanted == "array" and "items" in node:
        for i, item in enumerate(value):
            _node(report, kind, node["items"], item, f"{path}[{i}]")


def _object(report: ShapeReport, kind: str, node: dict[str, Any], value: dict[str, Any],
            path: str) -> None:
    fields: dict[str, Any] = node["fields"]
    for name, item in value.items():
        where = f"{path}.{name}"
        if name in fields:
            _node(report, kind, fields[name], item, where)
            continue
        close = _close(name, fields)
        if close:
            report.errors.append(Finding(where, f"unknown field {name!r} in {path}: did you "
                                                f"mean {close!r}?"))
        else:
            report.warnings.append(Finding(
                where, f"field {name!r} is not in Fireworks' {kind} schema as this queue knows "
                       f"it (fireworks-ai {schema_version()}); sent as is"))
    for name in node.get("required", ()):
        if name not in value:
            report.errors.append(Finding(f"{path}.{name}",
                                         f"{path}.{name} is required for kind {kind}"))


def _close(name: str, fields: dict[str, Any]) -> str | None:
    lowered = {f.lower().replace("_", ""): f for f in fields}
    same = lowered.get(name.lower().replace("_", ""))
    if same:
        return same
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.85)
    return close[0] if close else None


def _rules(report: ShapeReport, kind: str, payload: dict[str, Any]) -> None:
    """What Fireworks states beyond the types."""
    blocks = [("fireworks_payload", payload)]
    training = payload.get("trainingConfig")
    if isinstance(training, dict):
        blocks.append(("fireworks_payload.trainingConfig", training))
    for path, block in blocks:
        length = block.get("maxContextLength")
        if _is(length, "integer") and length is not None and int(length) % 16:
            report.errors.append(Finding(f"{path}.maxContextLength",
                                         f"{path}.maxContextLength must be a multiple of 16 "
                                         f"(it is {length})"))
        if "baseModel" in block and "warmStartFrom" in block:
            report.errors.append(Finding(f"{path}.warmStartFrom",
                                         f"set only one of {path}.baseModel and "
                                         f"{path}.warmStartFrom"))
    inference = payload.get("inferenceParameters")
    if kind == "RFT" and isinstance(inference, dict):
        count = inference.get("responseCandidatesCount")
        if _is(count, "integer") and count is not None and int(count) < 2:
            report.errors.append(Finding(
                "fireworks_payload.inferenceParameters.responseCandidatesCount",
                "fireworks_payload.inferenceParameters.responseCandidatesCount must be at least "
                f"2 for kind RFT (it is {count}): the evaluator compares candidates"))
