"""Resource names a payload holds never reach a URL as anything but one whole, valid name
(issue 52, item 1): generated names of every sort (control characters, unicode, '%', '/',
'..', '?', '#', very long) are either refused by the shape check's rule or are names the
client sends as written, each segment percent-encoded."""

from __future__ import annotations

import contextlib
import re

import httpx
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sftq_server.preflight import check_shape
from sftq_server.provider import (
    FireworksClient,
    NotFound,
    full_resource_name,
    resource_name_problem,
)

SAFE = re.compile(r"accounts/[a-z0-9-]+/(datasets|models|evaluators)/[A-Za-z0-9._-]+")
NASTY = st.sampled_from(["\n", "\r", "\t", "\x00", "\x7f", "%", "%2F", "/", "..", "?", "#",
                         " ", "\u00e9", "\u202e", "\ufeff", "accounts/", "datasets/", ":"])
PIECES = st.one_of(st.text(max_size=12), NASTY,
                   st.from_regex(r"[a-z0-9][a-z0-9-]{0,10}", fullmatch=True))
VALID_ACCOUNT = st.from_regex(r"[a-z0-9][a-z0-9-]{0,20}", fullmatch=True)
VALID_ID = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)
NAMES = st.one_of(
    # A valid name with one nasty piece before, inside or after its id.
    st.builds(lambda a, i, n, where: f"accounts/{a}/datasets/" + (
        n + i if where == 0 else i[:1] + n + i[1:] if where == 1 else i + n),
        VALID_ACCOUNT, VALID_ID, NASTY, st.integers(0, 2)),
    st.lists(PIECES, max_size=6).map("".join),
    st.builds(lambda a, b, c: f"accounts/{a}/datasets/{b}{c}", PIECES, PIECES, PIECES),
    st.text(min_size=150, max_size=400),
)


@settings(max_examples=400, deadline=None)
@given(NAMES)
@example("accounts/acct/datasets/foo\n")
@example("accounts/acct/datasets/a%2Fb")
@example("accounts/acct/datasets/../quotas/q")
@example("foo\n")
def test_a_name_is_refused_or_is_whole_and_safe(name: str) -> None:
    full = full_resource_name("datasets", name, "acct")
    problem = resource_name_problem("datasets", name)
    assert (full is None) == (problem is not None), (name, full, problem)
    if full is not None:
        assert SAFE.fullmatch(full) and ".." not in full, full
        assert full == name or full == f"accounts/acct/datasets/{name}"
    else:
        report = check_shape("SFT", {"dataset": name, "baseModel": "m"})
        assert [f.path for f in report.errors] == ["fireworks_payload.dataset"], report


@settings(max_examples=200, deadline=None)
@given(NAMES)
@example("accounts/acct/datasets/foo\n")
def test_what_the_client_sends_is_the_name_as_written(name: str) -> None:
    seen: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"code": 5, "message": "not found"})

    client = FireworksClient(base_url="http://fw.test", api_key="k", account_id="acct",
                             transport=httpx.MockTransport(answer))
    with client:
        full = client.resource_name("datasets", name)
        if full is None:
            return
        with contextlib.suppress(NotFound):
            client.get_resource(full)
    assert seen == [f"/v1/{full}".encode()]
