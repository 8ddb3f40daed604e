"""The ``flowmq`` command."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import flowmq_ctl
from flowmq_broker.launcher import add_cluster_parser, cluster_command
from flowmq_broker.listeners import log_admin_api
from flowmq_broker.logfmt import configure_logging
from flowmq_core.config import ALL_ROLES, BrokerConfig, ConfigError, load_config
from flowmq_ctl.commands import add_cluster_status, add_commands, add_user_verbs
from flowmq_ctl.parser import Parser, common_options

log = logging.getLogger("flowmq")


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="run one broker (embedded defaults: SQLite meta store, local object store)",
        description="Run one broker. Every option can also be set in a TOML file (--config) "
        "or as a FLOWMQ_<OPTION> environment variable; flags win over both.",
    )
    serve.add_argument("--config", help="TOML config file (keys as the long options, with _)")
    defaults = BrokerConfig()
    text = {
        "data_dir": f"data directory (default {defaults.data_dir})",
        "node_id": "node name in the cluster (default: host name and HTTP port)",
        "meta": "meta store URL: sqlite:///rel/path.db, sqlite:////abs/path.db, fdb://cluster-file, "
        "memory:// (default sqlite:///<data-dir>/meta.db)",
        "objects": "object store URL: file:///abs/dir or a path, s3://bucket?endpoint=…&region=… "
        "(default file://<data-dir>/objects)",
        "http_port": f"admin API and metrics port (default {defaults.http_port}; 0 = any free port)",
        "mqtt_port": f"MQTT port (default {defaults.mqtt_port})",
        "mqtt_ws_port": f"MQTT over WebSocket port, path /mqtt (default {defaults.mqtt_ws_port})",
        "kafka_port": f"Kafka port (default {defaults.kafka_port})",
        "amqp_port": f"AMQP port (default {defaults.amqp_port})",
        "gossip_port": f"gossip (UDP) port (default {defaults.gossip_port})",
        "cluster_port": "inter-broker link port (default 0 = any free port)",
        "seeds": "comma-separated host:gossip-port of other brokers",
        "cluster_bind": f"address gossip and inter-broker links bind to (default "
        f"{defaults.cluster_bind}); anything but loopback needs a cluster secret",
        "cluster_secret": "shared secret authenticating gossip and links (at least 16 bytes); "
        "prefer --cluster-secret-file or FLOWMQ_CLUSTER_SECRET: flags are visible to all users",
        "cluster_secret_file": "file holding the cluster secret (its stripped content)",
        "tls_cert": "server certificate (PEM) for the TLS listeners; they open only with it",
        "tls_key": "the certificate's private key (PEM, unencrypted)",
        "tls_ca": "CA certificates (PEM): TLS clients must then present a certificate they signed",
        "tls_cert_as_username": "true or false: the client certificate's CN is the user "
        "(needs --tls-ca; default false)",
        "mqtt_tls_port": f"MQTT over TLS port (default {defaults.mqtt_tls_port})",
        "mqtt_wss_port": f"MQTT over secure WebSocket port, path /mqtt (default "
        f"{defaults.mqtt_wss_port})",
        "kafka_tls_port": f"Kafka SSL/SASL_SSL port (default {defaults.kafka_tls_port})",
        "amqp_tls_port": f"AMQP over TLS port (default {defaults.amqp_tls_port})",
        "http_tls_port": f"HTTPS port (default {defaults.http_tls_port})",
        "roles": f"comma-separated subset of {','.join(ALL_ROLES)} (default all)",
        "admin_token": "admin API Bearer token (default: generated once, kept in <data-dir>/admin_token)",
        "bind": f"address the MQTT, Kafka and AMQP listeners and the HTTP API bind to (default "
        f"{defaults.bind}; 0.0.0.0 or :: for every interface)",
        "allow_anonymous": "true or false: may clients connect without a user name (default: "
        "true while --bind is loopback, else false)",
        "acl_default": "allow or deny: what no ACL rule matches gets (default: allow while "
        "anonymous clients are allowed, else deny)",
        "log_level": "debug, info, warning or error (default info)",
        "log_format": "text (default) or json: one JSON object per log line",
        "mqtt_max_offline_bytes": "bytes of QoS 1/2 messages an offline persistent session "
        "keeps (default 64 MiB); past it publishes for it are refused (v5 0x97)",
        "mqtt_max_subscriptions": "subscriptions one MQTT session may hold (default 10000; "
        "0: no limit); past it SUBACK 0x97 / 0x80",
        "mqtt_max_sessions": "persistent MQTT sessions per namespace on this broker (default "
        "100000; 0: no limit); a CONNECT starting one more gets CONNACK 0x97 / 0x03",
        "mqtt_max_session_expiry": "longest MQTT session expiry granted, seconds (default "
        "604800, 7 days; also for 3.1.1 persistent sessions; 0: sessions end with their "
        "connection; 4294967295: no cap)",
        "mqtt_max_retained_messages": "retained messages per namespace (default 1000000; 0: "
        "no limit); new retained topics past it are not retained (v5 QoS 1/2: 0x97)",
        "mqtt_max_retained_bytes": "payload bytes of retained messages per namespace "
        "(default 1 GiB; 0: no limit)",
        "max_connections": "open connections per client listener (default 100000; 0: no "
        "limit); past it new connections are closed at once",
        "max_connections_per_address": "open connections from one client IP address, all "
        "client listeners together (default 10000; 0: no limit)",
        "mqtt_max_inflight_bytes": "payload bytes of QoS 1/2 messages in flight to one MQTT "
        "subscriber (default 16 MiB); past it the rest wait in its session",
        "mqtt_max_held_packets": "packets an MQTT client may send while its CONNECT waits "
        f"(default {defaults.mqtt_max_held_packets}); more closes it",
        "http_access_log": "true or false: log every HTTP API request (aiohttp's access log, "
        "logger aiohttp.access; default false)",
        "mqtt_max_keep_alive": "longest MQTT keep alive allowed, seconds (default 65535); "
        "a v5 client asking for more or for none is given this as server keep alive",
        "processes": "broker processes sharing the client ports (host mode; 0 = one per "
        "usable core; default 1, a single process)",
        "reuse_port": "true or false: bind the client ports with SO_REUSEPORT (set by host "
        "mode on its processes)",
        "gossip_interval": f"seconds between gossip rounds (default {defaults.gossip_interval})",
        "gossip_nodes": f"peers gossiped to per round (default {defaults.gossip_nodes})",
        "gossip_probe_interval": "seconds between failure-detector probes "
        f"(default {defaults.gossip_probe_interval})",
        "gossip_probe_timeout": "seconds to wait for a direct probe ack "
        f"(default {defaults.gossip_probe_timeout})",
        "gossip_indirect_checks": "members asked to probe a silent one "
        f"(default {defaults.gossip_indirect_checks})",
        "gossip_suspicion_mult": "suspicion timeout = this × max(1, log10(N+1)) × probe interval "
        f"(default {defaults.gossip_suspicion_mult})",
        "gossip_push_pull_interval": "seconds between full-state exchanges "
        f"(default {defaults.gossip_push_pull_interval})",
    }
    # Every config key is a flag, documented or not, so a key can never lack one.
    for field in dataclasses.fields(BrokerConfig):
        flag = "--" + field.name.replace("_", "-")
        serve.add_argument(flag, dest=field.name, default=None, help=text.get(field.name))


def _user_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    user = sub.add_parser(
        "user",
        help="manage users (MQTT user name/password; AMQP PLAIN; Kafka SASL PLAIN and SCRAM)",
        description="Users live in the meta store, so every broker sharing it sees them. "
        "The commands go through the admin API (--url, --token), or open the meta store "
        "themselves when given --data-dir, --meta or --config (no broker needed).",
    )
    # Given before or after the verb; SUPPRESS: the verb's parser does not reset them.
    local = argparse.ArgumentParser(add_help=False)
    group = local.add_argument_group("local meta store (instead of the admin API)")
    group.add_argument("--config", default=argparse.SUPPRESS,
                       help="TOML config file (for data_dir / meta)")  # fmt: skip
    group.add_argument("--data-dir", dest="data_dir", default=argparse.SUPPRESS,
                       help="data directory of the meta store to open")  # fmt: skip
    group.add_argument("--meta", default=argparse.SUPPRESS,
                       help="meta store URL (default: the data dir's)")  # fmt: skip
    for action in local._actions:
        user._add_action(action)
    actions = user.add_subparsers(dest="action", required=True, metavar="VERB")
    add_user_verbs(actions, common, local)


def _local_user_store(args: argparse.Namespace) -> bool:
    """``flowmq user`` opens the meta store itself when told where it is."""
    return any(getattr(args, name, None) for name in ("data_dir", "meta", "config"))


async def _user_command(config: BrokerConfig, args: argparse.Namespace) -> int:
    from flowmq_core.errors import InvalidName, NotFound
    from flowmq_meta import open_meta_store
    from flowmq_meta.api import MetaError
    from flowmq_meta.users import (
        InvalidPassword,
        delete_user,
        load_users,
        set_user,
        validate_password,
        validate_username,
    )

    if args.action in ("add", "passwd"):
        password = args.password
        if password is None:
            password = sys.stdin.readline().rstrip("\n")
        try:  # refuse bad input before touching the store
            validate_username(args.name)
            validate_password(password)
        except (InvalidName, InvalidPassword) as exc:
            print(f"flowmq: {exc}", file=sys.stderr)
            return 2
    try:
        store = open_meta_store(config.resolved().meta)
    except MetaError as exc:
        print(f"flowmq: {exc}", file=sys.stderr)
        return 1
    try:
        if args.action == "add":
            try:
                await set_user(store, args.name, password, namespace=args.namespace)
            except (InvalidName, NotFound) as exc:  # a bad or unknown --namespace
                print(f"flowmq: {exc}", file=sys.stderr)
                return 2 if isinstance(exc, InvalidName) else 1
            print(f"user {args.name} saved")
        elif args.action == "passwd":
            if args.name not in await load_users(store):
                print(f"flowmq: no user {args.name}", file=sys.stderr)
                return 1
            await set_user(store, args.name, password)
            print(f"password of user {args.name} changed")
        elif args.action == "delete":
            if not await delete_user(store, args.name):
                print(f"flowmq: no user {args.name}", file=sys.stderr)
                return 1
            print(f"user {args.name} deleted")
        else:
            for name in sorted(await load_users(store)):
                print(name)
        return 0
    finally:
        await store.close()


async def _serve(config: BrokerConfig) -> int:
    # Imported here: the admin commands start without loading the broker.
    from flowmq_broker.runtime import tune_interpreter
    from flowmq_broker.server import Broker, StartupError

    tune_interpreter()
    broker = Broker(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await broker.start()
    except StartupError as exc:
        await broker.stop()
        print(f"flowmq: {exc}", file=sys.stderr)
        return 1
    if not config.reuse_port:  # in host mode the supervisor tells the shared one
        log_admin_api(broker.config.bind, broker.ports["http"], broker.data_dir)
    await stop.wait()
    log.info("shutting down")
    await broker.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="flowmq",
        description="FlowMQ-py: run a broker (serve, cluster) and operate it through its "
        "admin API (every other command; docs/cli.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_options()
    _serve_parser(sub)
    _user_parser(sub, common)
    add_cluster_status(add_cluster_parser(sub), common)
    add_commands(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.command == "cluster" and not getattr(args, "cluster_verb", None):
        return cluster_command(args)

    if args.command == "user" and _local_user_store(args):
        flags = {"data_dir": getattr(args, "data_dir", None), "meta": getattr(args, "meta", None)}
        try:
            config = load_config(flags, config_file=getattr(args, "config", None))
        except ConfigError as exc:
            print(f"flowmq: {exc}", file=sys.stderr)
            return 2
        data_dir = Path(config.resolved().data_dir)
        if args.action != "add" and not getattr(args, "meta", None) and not data_dir.is_dir():
            # Only ``add`` may create a data dir (and its meta store); never by accident.
            print(f"flowmq: data dir {data_dir} does not exist", file=sys.stderr)
            return 1
        return asyncio.run(_user_command(config, args))

    if args.command == "serve":
        flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
        try:
            config = load_config(flags, config_file=args.config)
        except ConfigError as exc:
            print(f"flowmq: {exc}", file=sys.stderr)
            return 2
        configure_logging(config.log_level, config.log_format)
        from flowmq_broker.hostmode import run_host_mode, usable_cores

        processes = config.processes or usable_cores()
        if processes > 1:
            return run_host_mode(config, processes)
        try:
            import uvloop
        except ImportError:  # uvloop is optional (not built for every platform)
            return asyncio.run(_serve(config))
        return uvloop.run(_serve(config))
    return flowmq_ctl.run(args, parser)


if __name__ == "__main__":
    sys.exit(main())
