"""Tenants against a real broker process: namespaces ``a`` and ``b``, users ``alice`` (in
``a``) and ``bob`` (in ``b``), anonymous clients refused, so every client is one tenant's.

``tenants_broker``: one ``flowmq serve`` per module, set up through the admin API with the
cluster admin token.  ``http``: one admin API call with any token.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.admin_http import api_call
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.brokers import no_broker_tracebacks, uid  # noqa: F401

TIMEOUT = 10.0
USERS = {"alice": ("wonderland", "a"), "bob": ("builder", "b")}


def http(
    broker: BrokerProcess, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    """One admin API call (``path`` under ``/api/v1``): (status, decoded envelope)."""
    return api_call(method, f"{broker.http}/api/v1{path}", body, token, TIMEOUT)


def set_up_tenants(broker: BrokerProcess) -> None:
    for namespace in ("a", "b"):
        status, answer = http(broker, "POST", "/namespaces", {"name": namespace}, broker.token)
        assert status == 201, answer
    for name, (password, namespace) in USERS.items():
        body = {"username": name, "password": password, "namespace": namespace}
        status, answer = http(broker, "POST", "/users", body, broker.token)
        assert status == 201, answer


@pytest.fixture(scope="module")
def tenants_broker(tmp_path_factory) -> Iterator[BrokerProcess]:
    # Tenancy alone: authorization allows what no rule denies (ACLs are tested on their own).
    broker = start_broker(
        tmp_path_factory.mktemp("tenants") / "data",
        "--allow-anonymous",
        "false",
        "--acl-default",
        "allow",
    )
    try:
        set_up_tenants(broker)
        yield broker
    finally:
        broker.stop()
