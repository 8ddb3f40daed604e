"""The admin commands' parsers: each leaf parser sets ``handler(args, ctx) -> exit code``.

``add_commands`` adds the resource commands to ``flowmq``'s subparsers; ``add_user_verbs``
and ``add_cluster_status`` extend the two commands that existed before the CLI talked to the
admin API (``flowmq user`` still opens the meta store itself when given ``--data-dir``,
``--meta`` or ``--config``; ``flowmq cluster`` without a verb is still the local launcher).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from flowmq_core.acl import ACTIONS as ACL_ACTIONS
from flowmq_ctl import messaging, resources, tail
from flowmq_ctl.completion import completion

Handler = Callable[..., int]


def _namespace_option() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "-n",
        "--namespace",
        default=argparse.SUPPRESS,
        help="namespace (default: the broker's default namespace)",
    )
    return parent


def _verbs(
    sub: argparse._SubParsersAction, name: str, text: str, description: str = ""
) -> argparse._SubParsersAction:
    parser = sub.add_parser(name, help=text, description=description or text)
    return parser.add_subparsers(dest="verb", required=True, metavar="VERB")


def _leaf(
    verbs: argparse._SubParsersAction,
    name: str,
    handler: Handler,
    text: str,
    parents: list[argparse.ArgumentParser],
    epilog: str = "",
) -> argparse.ArgumentParser:
    parser = verbs.add_parser(name, help=text, description=text, parents=parents, epilog=epilog)
    parser.set_defaults(handler=handler)
    return parser


def _stream_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--filter",
        action="append",
        dest="filters",
        metavar="FILTER",
        help="topic filter routed into the stream (repeat for several; default: the name "
        "with '.' as '/')",
    )
    parser.add_argument("--partitions", type=int, help="number of partitions (only grows)")
    parser.add_argument("--retention-ms", type=int, help="keep records this long (-1: forever)")
    parser.add_argument(
        "--retention-bytes", type=int, help="keep this many bytes per partition (-1: unbounded)"
    )


def _queue_settings(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--filter", help="topic filter routed into the queue")
    parser.add_argument("--max-size-mb", type=int, help="refuse publishes past this size")
    parser.add_argument("--ttl-seconds", type=int, help="messages expire after this long")
    parser.add_argument("--max-retries", type=int, help="deliveries before dead-lettering")
    parser.add_argument("--dead-letter-topic", help="topic dead letters are published to")


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    ns = _namespace_option()
    both = [common, ns]

    verbs = _verbs(sub, "stream", "manage Streams (partitioned logs, Kafka topics)")
    create = _leaf(verbs, "create", resources.stream_create, "create a stream", both,
                   "example: flowmq stream create orders --filter 'orders/#' --partitions 3")  # fmt: skip
    create.add_argument("name", help="stream name (a Kafka topic name)")
    _stream_settings(create)
    _leaf(verbs, "list", resources.stream_list, "list streams with their live counts", both)
    _leaf(verbs, "describe", resources.stream_describe,
          "a stream's settings, offsets, bytes and segments", both).add_argument("name")  # fmt: skip
    update = _leaf(verbs, "update", resources.stream_update, "change a stream's settings", both)
    update.add_argument("name")
    _stream_settings(update)
    _leaf(verbs, "delete", resources.stream_delete, "delete a stream and its records",
          both).add_argument("name")  # fmt: skip

    verbs = _verbs(sub, "queue", "manage Queues (competing consumers, at-least-once)")
    create = _leaf(verbs, "create", resources.queue_create, "create a queue", both,
                   "example: flowmq queue create jobs --filter 'jobs/#'")  # fmt: skip
    create.add_argument("name")
    _queue_settings(create)
    create.add_argument("--shards", type=int, help="index shards, fixed at creation (1: FIFO)")
    _leaf(verbs, "list", resources.queue_list, "list queues with ready/unacked counts", both)
    _leaf(verbs, "describe", resources.queue_describe, "a queue's settings and counts",
          both).add_argument("name")  # fmt: skip
    _leaf(verbs, "purge", resources.queue_purge, "drop every ready message of a queue",
          both).add_argument("name")  # fmt: skip
    _leaf(verbs, "delete", resources.queue_delete, "delete a queue and its messages",
          both).add_argument("name")  # fmt: skip

    verbs = _verbs(sub, "subscription", "Subscriptions (memory push) on the broker")
    _leaf(verbs, "list", resources.subscription_list, "list MQTT subscriptions", both)

    verbs = _verbs(sub, "namespace", "manage namespaces (tenants)")
    _leaf(verbs, "list", resources.namespace_list, "list namespaces", [common])
    _leaf(verbs, "create", resources.namespace_create, "create a namespace",
          [common]).add_argument("name")  # fmt: skip
    _leaf(verbs, "delete", resources.namespace_delete, "delete an empty namespace",
          [common]).add_argument("name")  # fmt: skip

    verbs = _verbs(sub, "token", "namespace-scoped admin tokens (cluster admin token only)")
    create = _leaf(verbs, "create", resources.token_create,
                   "create a token for one namespace; prints its secret, shown only once",
                   [common], "example: flowmq token create -n tenant-a --role viewer")  # fmt: skip
    create.add_argument("-n", "--namespace", required=True, help="the token's namespace")
    create.add_argument("--role", required=True, choices=("admin", "viewer"),
                        help="admin: read and change the namespace; viewer: read it")  # fmt: skip
    create.add_argument("--description", help="a note for operators (who holds it)")
    _leaf(verbs, "list", resources.token_list, "list tokens (never their secrets)", [common])
    _leaf(verbs, "delete", resources.token_delete, "delete a token", [common]).add_argument(
        "id", help="the token id (flowmq token list)"
    )

    verbs = _verbs(sub, "acl", "authorization rules (docs/security.md#authorization)")
    add = _leaf(verbs, "add", resources.acl_add, "add a rule",
                [common], "example: flowmq acl add alice 'sensors/#' publish -n plant-1")  # fmt: skip
    add.add_argument("principal", help="a user, group:<name> or *")
    add.add_argument("resource", help="a topic filter, stream:<name>, queue:<name>, "
                     "group:<kafka group> or namespace")  # fmt: skip
    add.add_argument("action", choices=ACL_ACTIONS)
    add.add_argument("--effect", choices=("allow", "deny"), default="allow")
    add.add_argument("-n", "--namespace", help="the rule's namespace (default: default)")
    listing = _leaf(verbs, "list", resources.acl_list, "list rules", [common])
    listing.add_argument("-n", "--namespace", help="only this namespace's rules")
    _leaf(verbs, "delete", resources.acl_delete, "delete a rule", [common]).add_argument(
        "id", help="the rule id (flowmq acl list)"
    )

    verbs = _verbs(sub, "group", "consumer groups: members, committed offsets, lag")
    _leaf(verbs, "list", resources.group_list, "list consumer groups", both)
    _leaf(verbs, "describe", resources.group_describe,
          "a group's members, committed offsets and lag", both).add_argument("group")  # fmt: skip
    reset = _leaf(verbs, "reset-offsets", resources.group_reset,
                  "set a group's committed offsets (refused while it has members)", both,
                  "example: flowmq group reset-offsets billing --stream orders --to earliest")  # fmt: skip
    reset.add_argument("group")
    reset.add_argument("--stream", required=True, help="the stream whose offsets to set")
    reset.add_argument("--to", required=True, help="earliest, latest or an offset")
    reset.add_argument("--partition", type=int, help="one partition (default: all)")

    verbs = _verbs(sub, "client", "client connections on the broker (MQTT, AMQP, Kafka)")
    listed = _leaf(verbs, "list", resources.client_list, "list connections", [common])
    listed.add_argument("--protocol", choices=("mqtt", "amqp", "kafka"))
    _leaf(verbs, "kick", resources.client_kick,
          "disconnect a client (MQTT v5: DISCONNECT 0x98, administrative action)",
          [common]).add_argument("id", help="connection id (protocol:address) or MQTT client id")  # fmt: skip

    produce = sub.add_parser(
        "produce",
        parents=both,
        help="publish messages to a topic (standard input lines, or -m)",
        description="Publish to TOPIC through the admin API's HTTP publish: every Stream, "
        "Queue and Subscription whose filter matches gets the message.",
        epilog="example: echo hello | flowmq produce orders/eu --key customer-7",
    )
    produce.add_argument("dest", nargs="?", metavar="TOPIC", help="topic to publish to")
    produce.add_argument("--topic", help="topic to publish to (instead of TOPIC)")
    produce.add_argument("-m", "--message", action="append", help="a message (repeatable); "
                         "default: one message per line of standard input")  # fmt: skip
    produce.add_argument("--key", help="message key (Kafka partitioning)")
    produce.add_argument("--headers", action="append", metavar="K=V",
                         help="header(s), name=value[,name=value] (repeatable)")  # fmt: skip
    produce.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    produce.add_argument("--retain", action="store_true", help="MQTT retained message")
    produce.set_defaults(handler=messaging.produce)

    consume = sub.add_parser(
        "consume",
        parents=both,
        help="read a stream or take from a queue, one message per line",
        description="Print messages of stream or queue NAME, one per line (-o json: one "
        "JSON object per line). A stream is read from its end unless --from-beginning, "
        "--offset or --group says otherwise; messages taken from a queue are gone.",
        epilog="example: flowmq consume orders --from-beginning --num 10",
    )
    consume.add_argument("dest", metavar="NAME", help="stream or queue name")
    consume.add_argument("--type", choices=("stream", "queue"), help="default: look it up")
    consume.add_argument("--num", type=int, help="stop after this many messages")
    consume.add_argument("--timeout", type=float,
                         help="stop after this many seconds without a message")  # fmt: skip
    consume.add_argument("--from-beginning", action="store_true", help="stream: from the start")
    consume.add_argument("--offset", type=int, help="stream: from this offset")
    consume.add_argument("--partition", type=int, help="stream: only this partition")
    consume.add_argument("--group", help="stream: start at and commit this group's offsets")
    consume.add_argument("--peek", action="store_true",
                         help="queue: show the oldest messages without taking them")  # fmt: skip
    consume.add_argument("--print-key", action="store_true", help="print KEY<tab>VALUE")
    consume.set_defaults(handler=messaging.consume)

    follow = sub.add_parser(
        "tail",
        parents=[common],
        help="follow a topic filter live (an MQTT subscription)",
        description="Subscribe to FILTER on the broker's MQTT port and print each message "
        "as it arrives (-v: with its topic). Ctrl-C stops.",
        epilog="example: flowmq tail 'sensors/#' -v",
    )
    follow.add_argument("filter", metavar="FILTER", help="MQTT topic filter (+ and # allowed)")
    follow.add_argument("-v", "--verbose", action="store_true", help="print TOPIC PAYLOAD")
    follow.add_argument("--qos", type=int, choices=(0, 1, 2), default=0)
    follow.add_argument("--num", type=int, help="stop after this many messages")
    follow.add_argument("--timeout", type=float,
                        help="stop after this many seconds without a message")  # fmt: skip
    follow.add_argument("--mqtt", metavar="HOST:PORT",
                        help="MQTT listener (default: ./data/ports.json's, else 1883)")  # fmt: skip
    follow.add_argument("--username", help="MQTT user name")
    follow.add_argument("--password", help="MQTT password")
    follow.add_argument("--client-id", help="MQTT client id (default: flowmq-tail-<random>)")
    follow.set_defaults(handler=tail.tail)

    version = sub.add_parser("version", parents=[common], help="client and server versions")
    version.set_defaults(handler=resources.version)

    complete = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='Print a completion script: eval "$(flowmq completion bash)" in '
        "~/.bashrc, or flowmq completion zsh > a directory in $fpath as _flowmq.",
    )
    complete.add_argument("shell", choices=("bash", "zsh"))
    complete.set_defaults(handler=completion, local=True)


def add_user_verbs(
    actions: argparse._SubParsersAction,
    common: argparse.ArgumentParser,
    local: argparse.ArgumentParser,
) -> None:
    """``flowmq user list|add|passwd|delete``: over the admin API, or on the meta store
    itself when ``local``'s options (``--data-dir``, ``--meta``, ``--config``) are given."""
    parents = [common, local]
    _leaf(actions, "list", resources.user_list, "list users", parents)
    add = _leaf(actions, "add", resources.user_add, "create a user (a local store: or set its password)",
                parents, "example: flowmq user add sensor-17 --namespace default < password.txt")  # fmt: skip
    add.add_argument("name")
    add.add_argument("--password", help="the password (default: one line of standard input)")
    add.add_argument(
        "--namespace",
        default=None,
        help="the namespace the user belongs to (default: default; an existing user keeps its own)",
    )
    passwd = _leaf(actions, "passwd", resources.user_passwd, "change a user's password", parents)
    passwd.add_argument("name")
    passwd.add_argument("--password", help="the new password (default: standard input)")
    _leaf(actions, "delete", resources.user_delete, "remove a user", parents).add_argument("name")


def add_cluster_status(cluster: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """``flowmq cluster status``; ``flowmq cluster [options]`` alone still runs the launcher."""
    verbs = cluster.add_subparsers(dest="cluster_verb", metavar="[status]")
    status = verbs.add_parser(
        "status",
        parents=[common],
        help="nodes of a running cluster: status, roles, versions (admin API)",
        description="The cluster's nodes as the broker at --url sees them: gossip status, "
        "roles, version, address.",
    )
    status.set_defaults(handler=resources.cluster_status)
