"""The operations surface against real broker processes: the admin API's health, readiness,
live counts, reads, groups and clients (test_ops_api.py) and the ``flowmq`` CLI on top of it
(test_ctl_cli.py).

``broker``: one ``flowmq serve`` per module, its data dir ``<tmp>/data``, so a CLI run with
``cwd=broker.data_dir.parent`` finds the port and token the way an operator's would.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.fixtures.admin_http import api_call
from tests.fixtures.brokers import broker_fixtures, no_broker_tracebacks, uid  # noqa: F401

TIMEOUT = 10.0

broker, fresh_broker = broker_fixtures("ops")


def http(method: str, url: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
    """One admin API call: (status, decoded envelope)."""
    return api_call(method, url, body, token, TIMEOUT)


class MqttClient:
    """A paho client (v5 unless told) whose disconnects and messages land in queues."""

    def __init__(self, port: int, client_id: str, v5: bool = True, session_expiry: int = 0) -> None:
        """``session_expiry`` (v5, seconds): a persistent session, resumed if one exists."""
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
            reconnect_on_failure=False,
        )
        self.disconnects: queue.Queue[int] = queue.Queue()
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = lambda _c, _u, m: self.messages.put(m)
        self.client.on_disconnect = lambda _c, _u, _f, code, _p: self.disconnects.put(
            getattr(code, "value", code)
        )
        self.session_present: bool | None = None
        self.client.on_connect = self._on_connect
        if session_expiry:
            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = session_expiry
            self.client.connect("127.0.0.1", port, clean_start=False, properties=properties)
        else:
            self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._connected.wait(TIMEOUT), "no CONNACK"

    def _on_connect(self, _client, _userdata, flags, _reason, _properties) -> None:
        self.session_present = flags.session_present
        self._connected.set()

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        self._subscribed.clear()
        self.client.subscribe(topic_filter, qos)
        assert self._subscribed.wait(TIMEOUT), "no SUBACK"

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
