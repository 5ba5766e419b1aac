"""The sign-in form's reader (console/signin.py) on real ASGI requests: the key and the
page to go back to, and nothing (so the form is shown again) for anything that is not a small
urlencoded form."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from console.signin import MAX_FORM, _next, small_form


def request(body: bytes, content_type: str = "application/x-www-form-urlencoded") -> Request:
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return Request({"type": "http", "method": "POST", "path": "/console/login", "query_string": b"",
                    "headers": [(b"content-type", content_type.encode())]}, receive)


@pytest.mark.parametrize("body,content_type,expect", [
    (b"key=gpuflow-abc&next=%2Fconsole%2Fqueue", None, {"key": "gpuflow-abc", "next": "/console/queue"}),
    (b"key=a&key=b", None, {"key": "a"}),  # the first value of each field
    (b'{"key": "x"}', "application/json", {}),  # not a form
    (b"key=" + b"x" * MAX_FORM, None, {}),  # over MAX_FORM (4096) bytes
    (b"&".join(b"f%d=1" % i for i in range(9)), None, {}),  # 9 fields, more than the form's 8: not it
])
async def test_small_form(body, content_type, expect):
    assert await small_form(request(body, content_type or "application/x-www-form-urlencoded")) == expect


@pytest.mark.parametrize("v,expect", [
    ("/console/queue", "/console/queue"),
    ("//evil.example/console/", "/console/"),  # another site
    ("https://evil.example/", "/console/"),
    ("/console/\\evil", "/console/"),
    ("/v1/models", "/console/"),  # not a console page
])
def test_after_sign_in_only_a_console_page(v, expect):
    assert _next(v) == expect
