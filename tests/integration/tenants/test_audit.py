"""The audit trail (logger ``flowmq.audit``) and the HTTP access log, read from a real broker
process's log: every admin API change names who made it (a scoped token's id, or ``admin``),
what (method, path, status) and when (the line's time), refused ones included; refused
logins of MQTT, AMQP and Kafka are audit lines; ``--http-access-log`` turns aiohttp's access
log on.  Without the audit logger no line names ``flowmq.audit`` and these tests fail; without
the access-log key the broker refuses the flag, or logs no request."""

from __future__ import annotations

import paho.mqtt.client as mqtt
import pika
import pytest

from tests.fixtures.addresses import loopback_address
from tests.fixtures.broker_process import BrokerProcess, start_broker
from tests.fixtures.waiting import wait_until
from tests.integration.broker.test_users import connect_result
from tests.integration.kafka.conftest import RawKafka
from tests.integration.tenants.conftest import http
from tests.integration.tenants.test_admin_tokens import make_token
from tests.integration.tenants.test_tenant_isolation import amqp

AUDIT = " flowmq.audit: "
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


def audit_lines(broker: BrokerProcess, mark: int = 0) -> list[str]:
    return [line for line in broker.output[mark:] if AUDIT in line]


def wait_for_audit(broker: BrokerProcess, mark: int, *parts: str) -> str:
    """The first audit line after ``mark`` holding every one of ``parts``."""

    def found() -> str | None:
        for line in audit_lines(broker, mark):
            if all(p in line for p in parts):
                return line
        return None

    return wait_until(found, 10, what=f"an audit line with {parts}")


def test_admin_api_changes_name_the_token_refusals_too(tenants_broker, uid):
    token = make_token(tenants_broker, "a", "admin")
    name = f"audited-{uid}"
    for namespace in ("a", "b"):
        status, _ = http(tenants_broker, "POST", f"/streams?namespace={namespace}",
                         {"name": name}, tenants_broker.token)  # fmt: skip
        assert status == 201
    mark = len(tenants_broker.output)

    assert http(tenants_broker, "DELETE", f"/streams/{name}", token=token["token"])[0] == 200
    line = wait_for_audit(tenants_broker, mark, f"DELETE /api/v1/streams/{name} -> 200")
    assert f"by token {token['id']} (admin of namespace a)" in line
    assert line[:4].isdigit(), "no time stamp"  # when: the record's time leads the line

    path = f"/streams/{name}?namespace=b"
    assert http(tenants_broker, "DELETE", path, token=token["token"])[0] == 403
    line = wait_for_audit(tenants_broker, mark, f"DELETE /api/v1{path} -> 403")
    assert f"token {token['id']}" in line

    assert http(tenants_broker, "DELETE", path, token=tenants_broker.token)[0] == 200
    wait_for_audit(tenants_broker, mark, f"DELETE /api/v1{path} -> 200 by admin")

    assert http(tenants_broker, "DELETE", path, token="not-a-token")[0] == 401
    wait_for_audit(tenants_broker, mark, f"DELETE /api/v1{path} -> 401 by unauthenticated")

    # Reads are not audited, nor is the secret ever logged.
    assert http(tenants_broker, "GET", "/streams", token=token["token"])[0] == 200
    assert http(tenants_broker, "GET", "/streams?namespace=a", token=tenants_broker.token)[0] == 200
    wait_for_audit(tenants_broker, mark, "-> 401")
    assert not [x for x in audit_lines(tenants_broker, mark) if "GET /api/v1/streams" in x]
    assert not [x for x in tenants_broker.output if token["token"] in x]


def test_refused_logins_of_every_protocol_are_audit_lines(tenants_broker):
    mark = len(tenants_broker.output)
    port = tenants_broker.ports["mqtt"]
    assert connect_result(port, mqtt.MQTTv5, "alice", "wrong") == 0x86
    wait_for_audit(tenants_broker, mark, "mqtt ", "CONNECT refused", "'alice'")

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        amqp(tenants_broker, "bob", "b").close()  # the right login, to check the vhost refusal
        amqp(tenants_broker, "alice", "b")
    wait_for_audit(tenants_broker, mark, "AMQP connection", "refused vhost b", "'alice'")

    raw = RawKafka(tenants_broker.ports["kafka"], source=loopback_address())
    try:
        assert raw.request(SASL_HANDSHAKE, 1, mechanism="PLAIN").error_code == 0
        answer = raw.request(SASL_AUTHENTICATE, 2, auth_bytes=b"\0bob\0wrong")
        assert answer.error_code != 0
    finally:
        raw.close()
    wait_for_audit(tenants_broker, mark, "kafka ", "SASL PLAIN authentication refused", "'bob'")


def access_lines(broker: BrokerProcess) -> list[str]:
    return [x for x in broker.output if '"GET /api/v1/health HTTP/1.1" 200' in x]


def test_access_log_is_off_by_default(tenants_broker):
    assert http(tenants_broker, "GET", "/health")[0] == 200
    assert http(tenants_broker, "GET", "/health")[0] == 200
    # The next audit line is logged after the health checks: the log has caught up by then.
    mark = len(tenants_broker.output)
    assert http(tenants_broker, "DELETE", "/tokens/0", token="wrong")[0] == 401
    wait_for_audit(tenants_broker, mark, "DELETE /api/v1/tokens/0 -> 401")
    assert access_lines(tenants_broker) == []


def test_access_log_on(tmp_path):
    broker = start_broker(tmp_path / "data", "--http-access-log", "true")
    try:
        assert http(broker, "GET", "/health")[0] == 200
        line = wait_until(lambda: access_lines(broker), 10, what="an access log line")[0]
        assert "aiohttp.access" in line
        assert http(broker, "GET", "/streams", token=broker.token)[0] == 200
        logged = wait_until(
            lambda: [x for x in broker.output if '"GET /api/v1/streams HTTP/1.1" 200' in x],
            10,
            what="the access log line of an authenticated call",
        )
        assert broker.token not in logged[0]  # the Authorization header is not logged
    finally:
        broker.stop()
