"""Hand-written hostile requests: the bodies, and a way to send bytes exactly as written."""

from __future__ import annotations

import json
import re
import socket
import time
from typing import Any

from rel_probes import JOBS, envelope_problem


def _nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    return (opener * depth + closer * depth).encode()


def _obj_nested(depth: int) -> bytes:
    return ('{"a":' * depth + "1" + "}" * depth).encode()


def _body(payload: bytes, **fields: Any) -> bytes:
    head = json.dumps({"kind": "SFT", **fields})[:-1]
    return head.encode() + b', "fireworks_payload": ' + payload + b"}"


SQLISH = ["'; DROP TABLE sftq.jobs; --", "' OR '1'='1", "\\'; SELECT pg_sleep(5); --",
          "$$; DELETE FROM sftq.users; $$", "%s %(x)s {0} %n", "1; COMMIT; DROP SCHEMA sftq",
          "\"); TRUNCATE sftq.job_events; --", "sftq.jobs WHERE 1=1 --"]

BODIES: list[tuple[str, bytes, set[int]]] = [
    # (name, raw body, acceptable statuses)
    ("over the size limit", _body(b'{"x": "' + b"a" * 1_048_600 + b'"}'), {413}),
    ("nested arrays 100k", _body(_nested(100_000)), {400}),
    ("nested objects 20k", _body(_obj_nested(20_000)), {400}),
    ("nested arrays 150", _body(_nested(150)), {201, 400}),
    ("mixed nesting 5k", _body(b'{"a":' + _nested(5_000, '[{"b":', "}]")[:-5_000 * 2] + b"1"
                               + b"}]" * 5_000 + b"}"), {400}),
    ("100k-element array", _body(b'{"a": [' + b",".join([b"1"] * 100_000) + b"]}"), {201}),
    ("20k keys", _body(json.dumps({f"k{i}": i for i in range(20_000)}).encode()), {201}),
    ("empty body", b"", {400}),
    ("whitespace body", b"   \n\t ", {400}),
    ("JSON null", b"null", {400}),
    ("JSON array", b"[]", {400}),
    ("JSON string", b'"SFT"', {400}),
    ("JSON number", b"4", {400}),
    ("truncated", b'{"kind": "SFT", "fireworks_payload": {', {400}),
    ("trailing garbage", _body(b"{}") + b"garbage", {400}),
    ("two documents", _body(b"{}") + _body(b"{}"), {400}),
    ("kind as number", b'{"kind": 1, "fireworks_payload": {}}', {400}),
    ("kind as list", b'{"kind": ["SFT"], "fireworks_payload": {}}', {400}),
    # Any case is accepted (issue 18.6) and stored upper case.
    ("kind lowercase", b'{"kind": "sft", "fireworks_payload": {}}', {201}),
    ("kind with NUL", b'{"kind": "SFT\\u0000", "fireworks_payload": {}}', {400}),
    ("kind SQL", json.dumps({"kind": SQLISH[0], "fireworks_payload": {}}).encode(), {400}),
    ("payload as list", _body(b"[]"), {400}),
    ("payload as string", _body(b'"{}"'), {400}),
    ("payload null", _body(b"null"), {400}),
    ("gpu_count string", _body(b"{}", gpu_count="4"), {400}),
    ("gpu_count float", _body(b"{}", gpu_count=4.5), {400}),
    ("gpu_count 4.0", _body(b"{}", gpu_count=4.0), {400}),
    ("gpu_count bool", _body(b"{}", gpu_count=True), {400}),
    ("gpu_count 2^63", _body(b"{}", gpu_count=2**63), {400}),
    ("gpu_count -1", _body(b"{}", gpu_count=-1), {400}),
    ("gpu_count 1e2", b'{"kind":"SFT","gpu_count":1e2,"fireworks_payload":{}}', {400}),
    ("display_name number", _body(b"{}", display_name=5), {400}),
    ("display_name object", _body(b"{}", display_name={"a": 1}), {400}),
    ("display_name 257", _body(b"{}", display_name="x" * 257), {400}),
    ("display_name 256 astral", _body(b"{}", display_name="\U0001f600" * 256), {201}),
    ("unknown field", _body(b"{}", gpus=4), {400}),
    ("duplicate kind", b'{"kind":"SFT","kind":"DPO","fireworks_payload":{}}', {201}),
    ("NaN", _body(b'{"lr": NaN}'), {400}),
    ("Infinity", _body(b'{"lr": -Infinity}'), {400}),
    ("1e400", _body(b'{"lr": 1e400}'), {400}),
    ("5000 digits", _body(b'{"n": ' + b"9" * 5000 + b"}"), {400}),
    ("huge int", _body(b'{"n": 123456789012345678901234567890}'), {201}),
    ("tiny float", _body(b'{"lr": 1e-400}'), {201, 400}),
    ("NUL in value", _body(b'{"a": "x\\u0000y"}'), {400}),
    ("NUL in key", _body(b'{"a\\u0000": 1}'), {400}),
    ("NUL in display_name", _body(b"{}", display_name="a\x00b"), {400}),
    ("raw NUL byte", _body(b'{"a": "x\x00y"}'), {400}),
    ("lone high surrogate", _body(b'{"a": "\\ud800"}'), {400}),
    ("lone low surrogate in key", _body(b'{"\\udc00": 1}'), {400}),
    ("reversed surrogates",
     b'{"kind":"SFT","display_name":"\\udc00\\ud800","fireworks_payload":{}}', {400}),
    ("surrogate pair", _body(b'{"a": "\\ud83d\\ude00"}'), {201}),
    ("invalid UTF-8", _body(b'{"a": "\xff\xfe"}'), {400}),
    ("overlong UTF-8", _body(b'{"a": "\xc0\xaf"}'), {400}),
    ("UTF-8 BOM", b"\xef\xbb\xbf" + _body(b"{}"), {201, 400}),
    ("UTF-16", _body(b"{}").decode().encode("utf-16"), {400}),
    ("noncharacters", _body(json.dumps({"a": "\ufffe\uffff\U0010ffff"}).encode()), {201}),
    ("RTL and combining", _body(json.dumps({"a": "\u202e\u0301\u200d"}).encode(),
                                display_name="\u202egnp.exe\u0301"), {201}),
    ("escaped slash and quotes", _body(b'{"a\\/b": "\\"\\\\"}'), {201}),
    *((f"SQL-like display_name {i}", _body(b"{}", display_name=s), {201})
      for i, s in enumerate(SQLISH)),
    ("SQL-like payload", _body(json.dumps({s: s for s in SQLISH}).encode()), {201}),
]


def body_problems(client: Any, key: str) -> tuple[list[str], int]:
    """POST every body of BODIES through a WSGI test client; what was wrong, and how many
    were accepted (each accepted one is read back: shown, and its display_name verbatim)."""
    problems = []
    created = 0
    for name, raw, expected in BODIES:
        resp = client.post(f"{JOBS}/jobs", data=raw, headers={
            "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        problem = envelope_problem(resp.status_code, resp.content_type, resp.get_data())
        if problem or resp.status_code not in expected:
            problems.append(f"{name}: {problem or resp.status_code} {resp.get_data()[:160]!r} "
                            f"(expected {sorted(expected)})")
        if resp.status_code == 201:
            created += 1
            job = resp.json["id"]
            shown = client.get(f"{JOBS}/jobs/{job}", headers={"Authorization": f"Bearer {key}"})
            if shown.status_code != 200:
                problems.append(f"{name}: accepted job {job} then GET {shown.status_code}")
            sent = json.loads(raw.decode("utf-8-sig"))
            if shown.json["display_name"] != sent.get("display_name"):
                problems.append(f"{name}: display_name not stored verbatim")
    return problems, created


# --- on the wire ---------------------------------------------------------------------------------

def raw_http(port: int, request: bytes, *, half_close: bool = True,
             timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (no client normalises the path or the headers) and read the
    answer until the server closes the connection."""
    deadline = time.monotonic() + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        for _ in range(10_000):  # the answers here are small; a server that trickles is a fail
            data = s.recv(65536)
            if not data or time.monotonic() > deadline:
                break
            chunks.append(data)
    raw = b"".join(chunks)
    if not raw.startswith(b"HTTP/"):
        # http.server answers a request line it cannot parse in HTTP/0.9 style: no status
        # line, no headers, just its HTML error page.
        found = re.search(rb"Error code: (\d{3})", raw)
        return (int(found.group(1)) if found else 0), {"content-type": "text/html"}, raw
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def _req(method: str, target: str, headers: list[tuple[str, str]] | None = None,
         body: bytes = b"", *, length: str | None = None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    for name, value in headers or []:
        lines.append(f"{name}: {value}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    elif body:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
