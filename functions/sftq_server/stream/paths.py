"""The stream's two paths, and what a WSGI-only jobs-api answers on them. Kept apart from
stream.py so that jobs-api does not import the async machinery on a cold start."""

from __future__ import annotations

from sftq_server.core.errors import SftqError
from sftq_server.http.web import Request, Response

MOUNT_PREFIX = "/functions/v1/jobs-api"
STREAM_ROUTES = ("/jobs/stream", "/jobs/{id}/stream")


class StreamUnavailable(SftqError):
    status, code = 501, "stream_unavailable"


def stream_unavailable(request: Request, *args: str) -> Response:
    """GET /jobs/stream and /jobs/{id}/stream on a server without the async stack: 501 (not
    retried), so clients fall back to polling."""
    raise StreamUnavailable(
        "this server does not stream; the stream is served by the jobs-stream function "
        "(functions/jobs_stream.py). Poll GET /jobs/{id} instead")


def parse_stream_path(path: str) -> str | bool:
    """'' for /jobs/stream, the raw id for /jobs/{id}/stream, False for any other path."""
    if path.startswith(MOUNT_PREFIX + "/"):
        path = path[len(MOUNT_PREFIX):]
    parts = path.strip("/").split("/")
    if parts == ["jobs", "stream"]:
        return ""
    if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "stream" and parts[1]:
        return parts[1]
    return False
