"""The dashboard is fast for a heavy user: with 10,000 jobs, the first page of jobs is painted
within 1 s of the navigation on the dev stack, it asks for one page of jobs (never the whole
history), and the page with all its files weighs under 300 KiB."""

from __future__ import annotations

import statistics

import pytest
from browser_support import Browser
from stack_support import Stack

pytestmark = pytest.mark.e2e

JOBS = 10_000
BUDGET_MS = 1000
BUDGET_BYTES = 300 * 1024

# Enqueue through the procedure, spread over 60 days, then end all but a few: the history of a
# heavy user (cancelled, which is the cheapest way to a terminal state; the list query reads the
# same index whatever the state).
SEED = """
WITH u AS (SELECT id FROM sftq.users WHERE name = %s)
SELECT count(*) FROM u, generate_series(1, %s) s,
       LATERAL sftq.enqueue(u.id, (ARRAY['SFT', 'DPO', 'RFT'])[1 + s %% 3], '{"dataset": "d"}',
                            'heavy ' || s, 1 + s %% 8, NULL,
                            now() - interval '60 days' + s * interval '8 minutes') e
"""
# Newest first: the user's head job stays put until the last one, so no cancel looks for the
# next head across the index entries the earlier cancels of this statement left behind.
END_MOST = """
SELECT count(*) FROM (SELECT j.id, j.user_id FROM sftq.jobs j
                       WHERE j.user_id = (SELECT id FROM sftq.users WHERE name = %s)
                         AND j.state = 'QUEUED' AND j.created_at < now() - interval '1 hour'
                       ORDER BY j.created_at DESC, j.id DESC) j,
       LATERAL sftq.cancel(j.user_id, j.id) c
"""


def test_first_paint_under_a_second_with_10000_jobs(stack: Stack, browser: Browser) -> None:
    key = stack.user("heavy")
    assert stack.sql(SEED, "heavy", JOBS) == [(JOBS,)]
    stack.sql(END_MOST, "heavy")
    total = stack.sql("SELECT count(*) FROM sftq.jobs j JOIN sftq.users u ON u.id = j.user_id "
                      "WHERE u.name = 'heavy'")[0][0]
    assert total == JOBS

    b = browser
    b.sign_in(stack.url, key)
    b.wait(lambda: b.js("return document.documentElement.dataset.firstJobs === '1'"),
           "the first page of jobs")
    # What a first visit downloads (a fresh profile, nothing cached): the page and every file
    # it loaded, as bodies.
    page, files = b.js("""
        const nav = performance.getEntriesByType('navigation')[0];
        const files = performance.getEntriesByType('resource')
          .filter(e => e.name.includes('/dashboard/'));
        return [nav.decodedBodySize, files.map(e => [e.name, e.decodedBodySize])];""")
    names = {name.rsplit("/", 1)[-1] for name, size in files if size > 0}
    assert {"app.js", "api.js", "dom.js", "live.js", "style.css", "view-jobs.js", "charts.js",
            "view-charts.js", "icon.svg"} <= names, names
    weight = page + sum(size for _, size in files)
    print(f"page and files: {weight} bytes")
    assert page > 0 and weight < BUDGET_BYTES

    timings = []
    for _ in range(3):
        # A fresh load of the page in this tab (the key stays in sessionStorage).
        b.get(stack.url)
        b.wait(lambda: b.js("return document.documentElement.dataset.firstJobs === '1'"),
               "the first page of jobs")
        mark, fcp = b.js("""return [performance.getEntriesByName('sftq:first-jobs')[0].startTime,
            performance.getEntriesByName('first-contentful-paint')[0].startTime]""")
        assert fcp <= mark
        timings.append(float(mark))
        assert len(b.attrs("#jobs-table tbody tr", "data-job-id")) == 25
    print(f"first page of jobs painted after {[round(t) for t in timings]} ms")
    assert statistics.median(timings) < BUDGET_MS, timings

    # One page of jobs was asked for, never the whole list.
    urls = b.js("return performance.getEntriesByType('resource').map(e => e.name)")
    lists = [u for u in urls if "/jobs-api/jobs?" in u or u.endswith("/jobs-api/jobs")]
    assert lists and all("limit=25" in u for u in lists), lists
    assert b.console_errors() == []
