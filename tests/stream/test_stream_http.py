"""The stream over real HTTP with a real SSE client (httpx-sse)."""

from __future__ import annotations

from stream_support import Reader, Sql, data


def test_job_stream_frames_in_order_then_end(asgi, sql: Sql) -> None:
    key = sql.user("alice")
    job = sql.enqueue("alice")
    r = Reader(f"{asgi.url}/jobs/{job}/stream", key)
    first = r.wait_events(1)[0]
    assert r.status == 200 and r.content_type == "text/event-stream"
    assert first.event == "status" and data(first)["state"] == "QUEUED" and first.id
    sql.admit()
    sql.submitted(job)
    sql.provider(job, "JOB_STATE_RUNNING")
    sql.provider(job, "JOB_STATE_COMPLETED")
    events = r.wait_for(lambda evs: any(e.event == "end" for e in evs))
    r.join()
    kinds = [(e.event, data(e).get("state")) for e in events]
    assert kinds == [("status", "QUEUED"), ("status", "PROGRESS"), ("progress", None),
                     ("status", "SUCCESS"), ("end", None)], kinds
    assert data(events[1])["completed_at"] is None and data(events[1])["started_at"]
    assert data(events[2])["provider_state"] == "JOB_STATE_RUNNING"
    ids = [e.id for e in events[:-1]]
    assert all(ids) and ids == sorted(ids, key=int) and len(set(ids)) == len(ids)
    assert events[-1].id == events[-2].id
