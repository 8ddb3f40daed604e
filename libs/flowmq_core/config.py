"""Broker configuration: defaults < TOML file (``--config``) < ``FLOWMQ_*`` env < flags.

Every key is a field of ``BrokerConfig``; the TOML key, the env var (``FLOWMQ_`` + upper
case) and the flag (``--`` + dashes) are all derived from the field name, so the three can
never drift apart.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ALL_ROLES = ("mqtt", "kafka", "amqp", "admin")


class ConfigError(Exception):
    """A configuration value is missing, malformed or contradictory."""


@dataclasses.dataclass
class BrokerConfig:
    data_dir: str = "./data"
    node_id: str = ""  # empty: derived from the host name and HTTP port at start
    meta: str = ""  # empty: sqlite:///<data_dir>/meta.db
    objects: str = ""  # empty: file://<abs data_dir>/objects
    http_port: int = 8080
    mqtt_port: int = 1883
    mqtt_ws_port: int = 8083  # MQTT over WebSocket, path /mqtt (docs/mqtt.md)
    kafka_port: int = 9092
    amqp_port: int = 5672
    gossip_port: int = 7946
    cluster_port: int = 0  # inter-broker link; 0 = pick a free port
    seeds: list[str] = dataclasses.field(default_factory=list)
    roles: list[str] = dataclasses.field(default_factory=lambda: list(ALL_ROLES))
    admin_token: str = ""  # empty: generated at first start, kept in <data_dir>/admin_token
    # Secure defaults (DESIGN.md §12, Mosquitto 2.0's model): the MQTT, Kafka and AMQP
    # listeners and the HTTP API bind ``bind``; clients without a user name may connect
    # (``allow_anonymous``) — when unset, only while ``bind`` is a loopback address.
    bind: str = "127.0.0.1"
    allow_anonymous: bool | None = None
    # Authorization (docs/security.md "Authorization"): what a request no ACL rule matches
    # gets, ``allow`` or ``deny``; unset (empty): ``allow`` while anonymous clients are
    # allowed, else ``deny``.
    acl_default: str = ""
    # Kafka's auto.create.topics.enable: Metadata/Produce for an unknown topic creates it.
    kafka_auto_create_topics: bool = True
    # Kafka's advertised.listeners host: the name Kafka clients are told to reach this broker
    # at (Metadata, FindCoordinator). Empty: the address each client reached it on (for
    # other brokers, the address gossip reaches them at). Set it behind NAT or port mapping.
    advertised_host: str = ""
    log_level: str = "info"
    log_format: str = "text"  # text (human) or json (one JSON object per line)
    # aiohttp's access log of the HTTP API (one line per request, logger ``aiohttp.access``).
    http_access_log: bool = False
    # Mosquitto's max_keepalive: a v5 client asking for more (or for none) is told this
    # value as the server keep alive; 3.1.1 clients are held to it without being told.
    mqtt_max_keep_alive: int = 65535
    # Bytes of QoS 1/2 messages an offline persistent session keeps (its durable queue);
    # past it a publish for that session is refused (v5 PUBACK 0x97; 3.1.1: disconnect).
    mqtt_max_offline_bytes: int = 64 * 1024 * 1024
    # Subscriptions one MQTT session may hold; a SUBSCRIBE adding more gets SUBACK 0x97
    # (v5) / 0x80 (3.1.1) for the filters past it. 0: no limit.
    mqtt_max_subscriptions: int = 10_000
    # Persistent MQTT sessions (clean start 0 / session expiry > 0, online or offline) one
    # namespace may have on one broker; a CONNECT that would start one more is refused (v5
    # CONNACK 0x97, 3.1.1 0x03), resuming one is not. Offline sessions are otherwise bounded
    # only by their expiry (mqtt_max_session_expiry). 0: no limit.
    mqtt_max_sessions: int = 100_000
    # Longest session expiry, seconds, the broker grants (v5 Session Expiry Interval, told
    # in CONNACK when capped; 3.1.1 clean session 0, which asks for "never"): a session
    # whose client stays away longer is removed with its stored messages. 0: sessions end
    # with their connection; 4294967295: no cap (sessions may never expire).
    mqtt_max_session_expiry: int = 7 * 24 * 3600
    # Retained messages per namespace, count and payload bytes; a new retained topic past
    # either is not retained (v5 QoS 1/2: PUBACK/PUBREC 0x97, not delivered). Replacing or
    # clearing a retained topic is always allowed. 0: no limit.
    mqtt_max_retained_messages: int = 1_000_000
    mqtt_max_retained_bytes: int = 1024 * 1024 * 1024
    # Open connections per client listener (MQTT TCP/TLS/WebSocket, Kafka, AMQP; not HTTP)
    # and per client IP address over all of them; past either a new connection is closed at
    # once. Behind a proxy or NAT every client has the proxy's address: raise the second.
    # 0: no limit.
    max_connections: int = 100_000
    max_connections_per_address: int = 10_000
    # Kafka's socket.request.max.bytes: an authenticated client's request larger than this
    # closes its connection as soon as the size prefix is read (nothing of it is buffered).
    kafka_max_request_bytes: int = 100 * 1024 * 1024
    # Kafka's message.max.bytes: the largest record batch (as sent, compressed) a Produce
    # may carry; a larger one gets MESSAGE_TOO_LARGE for its partition.  Also the bound on
    # what a compressed batch may decompress to when it is routed to other destinations.
    kafka_message_max_bytes: int = 1048588
    # Kafka's fetch.max.bytes: the most one Fetch answers (its own max_bytes if smaller),
    # beyond the one whole batch a consumer always gets so that it progresses.
    kafka_fetch_max_bytes: int = 50 * 1024 * 1024
    # Kafka's connections.max.idle.ms, in seconds: a Kafka connection that sent nothing for
    # this long (and waits for no answer) is closed; 0 keeps idle connections forever.
    kafka_idle_timeout: float = 600.0
    # AMQP (RabbitMQ's defaults): the frame_max and channel_max offered in Connection.Tune
    # and enforced from TuneOk on; the largest message body (max_message_size; past it the
    # channel is closed 406, and a connection holds at most four such bodies half-received);
    # and the unacknowledged deliveries a consumer without a prefetch count may have.
    amqp_frame_max: int = 131072
    amqp_channel_max: int = 2047
    amqp_max_message_bytes: int = 16 * 1024 * 1024
    amqp_max_unacked: int = 10_000
    # Payload bytes of QoS 1/2 messages in flight to one connected subscriber (besides the
    # client's receive maximum): past it the rest wait in its session queue, so a slow client
    # with a large window cannot pin 65,535 large messages in the broker's memory.
    mqtt_max_inflight_bytes: int = 16 * 1024 * 1024
    # Packets a client may send while its CONNECT waits (login check, session takeover);
    # reading stops meanwhile, so only one read's worth can arrive: more closes the client.
    mqtt_max_held_packets: int = 1000
    # Backpressure (docs/operations.md "Backpressure"): bytes of durable writes waiting for
    # the shared batcher's next flush past which publishers on every protocol are paused
    # (MQTT and AMQP stop reading them, Kafka throttles Produce, HTTP publish answers 503);
    # they resume once it is below half of this. 0: never paused.
    pending_writes_high_water: int = 64 * 1024 * 1024
    # …and durable writes (chunks: a Kafka partition's records of one Produce, a Queue
    # message, a persistent MQTT session's copy of a message) waiting for their flush to
    # commit: each costs about a kilobyte while it waits, however small (an MQTT message
    # fanned out to offline sessions is one per session), and their peak stays as the heap's
    # high-water mark (benchmarks/README.md, fuzz.py). Resumed below half. 0: not counted.
    pending_writes_high_water_chunks: int = 1024
    # The process's resident memory, bytes, past which publishers are paused the same way
    # (checked every second; resumed below 90 % of it). 0: no limit.
    memory_limit: int = 0
    # SWIM gossip (DESIGN.md §6; memberlist's LAN profile): seconds between gossip rounds,
    # peers per round, seconds between probes, direct-ack wait, members asked for an
    # indirect probe, suspicion timeout multiplier, seconds between full-state exchanges.
    gossip_interval: float = 0.2
    gossip_nodes: int = 3
    gossip_probe_interval: float = 1.0
    gossip_probe_timeout: float = 0.5
    gossip_indirect_checks: int = 3
    gossip_suspicion_mult: int = 4
    gossip_push_pull_interval: float = 30.0
    # The closed cluster plane (DESIGN.md §12, docs/security.md): the address gossip and the
    # inter-broker links bind to, and the shared secret that authenticates both (given
    # directly, or as a file whose stripped content it is). Without a secret the cluster
    # plane is open, so it may only bind a loopback address.
    cluster_bind: str = "127.0.0.1"
    cluster_secret: str = dataclasses.field(default="", repr=False)
    cluster_secret_file: str = ""
    # TLS on the client listeners (docs/security.md "TLS"): a listener's TLS port opens only
    # when tls_cert is set. PEM paths; with tls_ca client certificates are required and
    # verified, and tls_cert_as_username makes the certificate's subject CN the user name.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_cert_as_username: bool = False
    mqtt_tls_port: int = 8883
    mqtt_wss_port: int = 8084  # MQTT over secure WebSocket, path /mqtt
    kafka_tls_port: int = 9093  # Kafka's SSL and SASL_SSL security protocols
    amqp_tls_port: int = 5671
    http_tls_port: int = 8443
    # Host mode (DESIGN.md §14, docs/operations.md "Host mode"): ``flowmq serve`` runs this
    # many broker processes sharing the client ports; 0 = one per usable core. 1, a single
    # process, is the default until host mode pays on 2 cores (benchmarks/README.md).
    processes: int = 1
    # Set by host mode on the processes it starts: the client listeners and the HTTP API bind
    # with SO_REUSEPORT, sharing their ports with the host's other processes.
    reuse_port: bool = False

    def resolved(self) -> BrokerConfig:
        """A copy with the embedded defaults that depend on other keys filled in: the URLs
        under ``data_dir``, ``allow_anonymous`` from ``bind`` when it is not set, and
        ``acl_default`` from ``allow_anonymous``."""
        cfg = dataclasses.replace(self)
        if cfg.bind == "localhost":
            cfg.bind = "127.0.0.1"  # one address: asyncio would bind ::1 and 127.0.0.1 apart
        if cfg.allow_anonymous is None:
            cfg.allow_anonymous = is_loopback(cfg.bind)
        cfg.acl_default = cfg.acl_default.strip().lower() or (
            "allow" if cfg.allow_anonymous else "deny"
        )
        data_dir = Path(cfg.data_dir).expanduser()
        if not cfg.meta:
            cfg.meta = f"sqlite:///{data_dir / 'meta.db'}"
        if not cfg.objects:
            cfg.objects = (data_dir.absolute() / "objects").as_uri()
        return cfg

    def validate(self) -> None:
        unknown = [role for role in self.roles if role not in ALL_ROLES]
        if unknown or not self.roles:
            raise ConfigError(
                f"roles must be a non-empty subset of {','.join(ALL_ROLES)}; got {','.join(self.roles) or 'nothing'}"
            )
        for field in dataclasses.fields(self):
            if field.name.endswith("_port"):
                port = getattr(self, field.name)
                if not 0 <= port <= 65535:
                    raise ConfigError(f"{field.name} must be 0..65535; got {port}")
        if self.log_level.lower() not in {"debug", "info", "warning", "error", "critical"}:
            raise ConfigError(
                f"log_level must be debug, info, warning or error; got {self.log_level}"
            )
        if self.acl_default.strip().lower() not in ("", "allow", "deny"):
            raise ConfigError(f"acl_default must be allow or deny; got {self.acl_default!r}")
        if self.bind != "localhost":
            try:
                ipaddress.ip_address(self.bind)
            except ValueError:
                raise ConfigError(
                    f"bind must be an IP address (127.0.0.1, 0.0.0.0, 10.0.0.5, ::) or "
                    f"localhost; got {self.bind!r}"
                ) from None
        if self.processes < 0:
            raise ConfigError(f"processes must be 0 (one per core) or more; got {self.processes}")
        if self.log_format.lower() not in {"text", "json"}:
            raise ConfigError(f"log_format must be text or json; got {self.log_format}")
        try:
            ipaddress.ip_address(self.cluster_bind)
        except ValueError:
            raise ConfigError(
                f"cluster_bind must be an IP address (127.0.0.1, 0.0.0.0, 10.0.0.5, ::); "
                f"got {self.cluster_bind!r}"
            ) from None
        if self.cluster_secret and self.cluster_secret_file:
            raise ConfigError("set cluster_secret or cluster_secret_file, not both")
        for name in _COUNT_LIMITS:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be 0 (no limit) or more; got {getattr(self, name)}")
        if not 0 <= self.mqtt_max_session_expiry <= 0xFFFFFFFF:
            raise ConfigError(
                f"mqtt_max_session_expiry must be 0..4294967295 seconds; "
                f"got {self.mqtt_max_session_expiry}"
            )

    def read_cluster_secret(self) -> str:
        """The cluster secret: ``cluster_secret``, else the stripped content of
        ``cluster_secret_file``; empty when neither is set."""
        if not self.cluster_secret_file:
            return self.cluster_secret.strip()
        try:
            secret = Path(self.cluster_secret_file).expanduser().read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise ConfigError(
                f"cannot read cluster_secret_file {self.cluster_secret_file}: {reason}"
            ) from None
        if not secret:
            raise ConfigError(f"cluster_secret_file {self.cluster_secret_file} is empty")
        return secret


# Limits counted in connections, subscriptions, messages or bytes: 0 is "no limit".
_COUNT_LIMITS = (
    "mqtt_max_subscriptions",
    "mqtt_max_sessions",
    "mqtt_max_retained_messages",
    "mqtt_max_retained_bytes",
    "max_connections",
    "max_connections_per_address",
    "pending_writes_high_water",
    "pending_writes_high_water_chunks",
    "memory_limit",
)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is reachable from this host only:
    127.0.0.0/8, ::1 or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _coerce(field: dataclasses.Field, raw: Any, source: str) -> Any:
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    kind = kind.removesuffix(" | None")  # optional keys: unset is the default, None
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            lowered = str(raw).strip().lower()
            if lowered in {"true", "1", "yes", "on"}:
                return True
            if lowered in {"false", "0", "no", "off"}:
                return False
            raise ValueError
        if kind.startswith("list"):
            if isinstance(raw, str):
                return [item.strip() for item in raw.split(",") if item.strip()]
            if isinstance(raw, list):
                return [str(item) for item in raw]
            raise TypeError
        if isinstance(raw, dict | list):
            raise TypeError
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {field.name} has an invalid value {raw!r}") from None


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> BrokerConfig:
    """Merge the sources; ``flags`` holds only the options given on the command line."""
    env = os.environ if env is None else env
    fields = {field.name: field for field in dataclasses.fields(BrokerConfig)}
    values: dict[str, Any] = {}

    config_file = config_file or env.get("FLOWMQ_CONFIG")
    if config_file:
        try:
            with open(config_file, "rb") as handle:
                table = tomllib.load(handle)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file} is not valid TOML: {exc}") from None
        for key, raw in table.items():
            name = key.replace("-", "_")
            if name not in fields:
                raise ConfigError(f"config file {config_file}: unknown key {key!r}")
            values[name] = _coerce(fields[name], raw, f"config file {config_file}")

    for name, field in fields.items():
        var = "FLOWMQ_" + name.upper()
        if var in env:
            values[name] = _coerce(field, env[var], f"environment variable {var}")

    for name, raw in (flags or {}).items():
        if raw is not None:
            values[name] = _coerce(fields[name], raw, f"--{name.replace('_', '-')}")

    config = BrokerConfig(**values)
    config.validate()
    return config
