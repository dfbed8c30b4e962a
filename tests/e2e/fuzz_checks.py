"""Schemathesis hooks for ``test_api_fuzz``: the checks of our own (loaded by the fuzzer
through ``SCHEMATHESIS_HOOKS``)."""

from __future__ import annotations

import os
from typing import Any

import schemathesis

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


@schemathesis.check
def viewer_cannot_write(ctx: Any, response: Any, case: Any) -> None:
    """With the viewer's token, no write may succeed (a 2xx on an unsafe method)."""
    if os.environ.get("DLO_FUZZ_ROLE") != "viewer":
        return
    if case.method.upper() not in SAFE_METHODS and 200 <= response.status_code < 300:
        raise AssertionError(f"a viewer's {case.method} succeeded with {response.status_code}")
