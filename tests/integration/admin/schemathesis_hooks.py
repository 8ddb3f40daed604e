"""Schemathesis hooks for the admin API run (loaded through SCHEMATHESIS_HOOKS).

One check replaces the built-in ``not_a_server_error``: it is the same, except that a 503
``destination_unavailable`` answer is the documented refusal to acknowledge a publish into a
Stream or Queue this build cannot store yet — the fuzzer creates such destinations itself —
and a 503 ``not_ready`` the documented answer of the readiness probe while a store is down.
"""

import json

import schemathesis


@schemathesis.check
def no_server_error_but_documented_unavailable(ctx, response, case):
    if response.status_code < 500:
        return None
    if response.status_code == 503:
        code = json.loads(response.content)["error"]["code"]
        if code in ("destination_unavailable", "not_ready"):
            return None
    raise AssertionError(f"server error {response.status_code}: {response.text[:500]}")
