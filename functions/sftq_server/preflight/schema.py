"""Fireworks' create-job request schemas, as the queue checks a fireworks_payload against them.

The schema lives in `fireworks_schema.json` next to this module, generated from the create-params
types of Fireworks' own SDK (the `fireworks-ai` package, itself generated from Fireworks'
OpenAPI). Checked in rather than read from the SDK at run time: the SDK is a test dependency,
not a server one, and importing it costs a cold start far more than reading 20 kB of JSON.
`python -m sftq_server.preflight.schema` rewrites the file from the installed SDK;
tests/functions/test_preflight.py fails when the file and the SDK disagree.

A schema node is {"type": "string" | "integer" | "number" | "boolean" | "array" | "object",
"enum": [...]?, "items": node?, "fields": {camelCaseName: node}?, "required": [...]?}.
"""

from __future__ import annotations

import json
import sys
import typing
from functools import cache
from pathlib import Path
from typing import Any

import typing_extensions as te

SCHEMA_FILE = Path(__file__).with_name("fireworks_schema.json")

# The SDK's create-params type per kind; its fields that are URL parameters, not body fields.
_SDK_TYPES = {
    "SFT": ("supervised_fine_tuning_job_create_params", "SupervisedFineTuningJobCreateParams"),
    "DPO": ("dpo_job_create_params", "DpoJobCreateParams"),
    "RFT": ("reinforcement_fine_tuning_job_create_params",
            "ReinforcementFineTuningJobCreateParams"),
}
_URL_PARAMS = {"account_id", "supervised_fine_tuning_job_id", "dpo_job_id",
               "reinforcement_fine_tuning_job_id"}


@cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return document


def schemas() -> dict[str, dict[str, Any]]:
    """Per kind, the object node of its create body."""
    kinds: dict[str, dict[str, Any]] = _document()["kinds"]
    return kinds


def schema_version() -> str:
    return str(_document()["sdk_version"])


# --- generation from the SDK ------------------------------------------------------------------

def _node(tp: Any) -> dict[str, Any]:
    origin = te.get_origin(tp)
    args = te.get_args(tp)
    if origin in (te.Annotated, te.Required, te.NotRequired):
        return _node(args[0])
    name = getattr(origin, "_name", None) or getattr(origin, "__name__", "")
    if origin in (typing.Literal, te.Literal):
        return {"type": "string", "enum": [str(a) for a in args]}
    if origin in (list, tuple) or name in ("Iterable", "Sequence", "List"):
        return {"type": "array", "items": _node(args[0])} if args else {"type": "array"}
    if origin in (dict,) or name in ("Dict", "Mapping"):
        return {"type": "object"}
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        kinds = [_node(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else {"type": "any"}
    if isinstance(tp, type) and te.is_typeddict(tp):
        return _object(tp)
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", object: "any"}
    return {"type": simple.get(tp, "any")}


def _unrequired(hint: Any) -> Any:
    return te.get_args(hint)[0] if te.get_origin(hint) in (te.Required, te.NotRequired) else hint


def _alias(hint: Any, name: str) -> str:
    for meta in getattr(hint, "__metadata__", ()):
        alias = getattr(meta, "alias", None)
        if alias:
            return str(alias)
    return name


def _object(td: Any, skip: set[str] | None = None) -> dict[str, Any]:
    hints = te.get_type_hints(td, include_extras=True)
    fields: dict[str, Any] = {}
    required: list[str] = []
    for name, hint in hints.items():
        if skip and name in skip:
            continue
        alias = _alias(_unrequired(hint), name)
        # (the SDK's modules use postponed annotations, so __required_keys__ is empty and
        # Required[...] shows only in the resolved hint)
        origin: Any = te.get_origin(hint)
        if origin is te.Required or name in td.__required_keys__:
            required.append(alias)
        fields[alias] = _node(hint)
    node: dict[str, Any] = {"type": "object", "fields": dict(sorted(fields.items()))}
    if required:
        node["required"] = sorted(required)
    return node


def generate() -> dict[str, Any]:
    import importlib
    from importlib.metadata import version

    kinds = {}
    for kind, (module, name) in _SDK_TYPES.items():
        td = getattr(importlib.import_module(f"fireworks.types.{module}"), name)
        kinds[kind] = _object(td, _URL_PARAMS)
    return {"generated_from": "fireworks-ai create-params types",
            "sdk_version": version("fireworks-ai"), "kinds": kinds}


def main() -> int:
    document = generate()
    SCHEMA_FILE.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA_FILE.name} from fireworks-ai {document['sdk_version']}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
