"""``flowmq`` admin commands as an operator runs them: a subprocess in the directory whose
``./data`` the broker serves from (so the URL and token come from ``ports.json`` and
``admin_token``), ``-o json`` parsed and checked, errors one line on stderr with the
documented exit code (1: refused or not found, 2: usage or no broker)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest
import yaml

from tests.fixtures.cli import flowmq
from tests.fixtures.waiting import wait_until
from tests.integration.ops.conftest import TIMEOUT, MqttClient

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def run(broker):
    """``run(*args)``: flowmq in the broker's working directory; asserts exit 0 and no stderr
    unless ``code`` says otherwise; ``-o json`` output is returned decoded (but for consume
    and tail, which print JSON Lines)."""

    def call(*args: str, code: int = 0, stdin: str | None = None, env=None):
        done = flowmq(*args, cwd=broker.data_dir.parent, stdin=stdin, env=env)
        assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
        if code == 0:
            assert done.stderr == "", done.stderr
        if code == 0 and "json" in args and args[0] not in ("consume", "tail"):
            return json.loads(done.stdout)  # consume and tail: JSON Lines, one per message
        return done

    return call


def one_line_error(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("flowmq: "), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_stream_verbs(run, uid):
    name = f"orders-{uid}"
    created = run("stream", "create", name, "--filter", f"{uid}/orders/#", "--filter",
                  f"{uid}/legacy/#", "--partitions", "3", "--retention-ms", "60000", "-o", "json")  # fmt: skip
    assert created["topic_filters"] == [f"{uid}/orders/#", f"{uid}/legacy/#"]
    assert (created["partitions"], created["retention_ms"]) == (3, 60000)
    listed = run("stream", "list", "-o", "json")
    assert [s["partitions"] for s in listed if s["name"] == name] == [3]
    table = run("stream", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["NAME", "PARTITIONS", "TOPIC_FILTERS"]
    assert any(line.split()[0] == name for line in table[1:])
    updated = run("stream", "update", name, "--partitions", "4", "-o", "json")
    assert updated["partitions"] == 4 and updated["topic_filters"] == created["topic_filters"]
    described = run("stream", "describe", name, "-o", "json")
    assert described["end_offsets"] == [0, 0, 0, 0] and described["segments"] == 0
    assert yaml.safe_load(run("stream", "describe", name, "-o", "yaml").stdout) == described
    deleted = run("stream", "delete", name)
    assert deleted.stdout == f"stream {name} deleted\n"
    one_line_error(run("stream", "describe", name, code=1), 1, name, "does not exist")
    one_line_error(run("stream", "update", name, code=2), 2, "nothing to update")


def test_queue_verbs_and_live_counts(run, uid):
    name = f"jobs-{uid}"
    created = run("queue", "create", name, "--filter", f"{uid}/jobs/#", "--max-retries", "3",
                  "--shards", "1", "-o", "json")  # fmt: skip
    assert (created["topic_filter"], created["max_retries"], created["shards"]) == (
        f"{uid}/jobs/#",
        3,
        1,
    )
    result = run("produce", f"{uid}/jobs/a", "-o", "json", stdin="one\ntwo\nthree\nfour\n")
    assert result["published"] == 4
    assert result["destinations"] == [{"type": "queue", "name": name}]
    counts = run("queue", "describe", name, "-o", "json")
    assert (counts["ready"], counts["unacked"], counts["consumers"]) == (4, 0, 0)
    peeked = run("consume", name, "--peek", "--num", "2")
    assert peeked.stdout == "one\ntwo\n"
    taken = run("consume", name, "--num", "3", "-o", "json").stdout
    assert [json.loads(line)["payload"] for line in taken.splitlines()] == ["one", "two", "three"]
    assert [q["ready"] for q in run("queue", "list", "-o", "json") if q["name"] == name] == [1]
    assert run("queue", "purge", name).stdout == f"queue {name}: 1 message(s) purged\n"
    assert run("queue", "describe", name, "-o", "json")["ready"] == 0
    assert run("queue", "delete", name, "-o", "json") == {"deleted": name}
    one_line_error(run("queue", "purge", name, code=1), 1, name)


def test_produce_then_consume_a_stream(run, uid):
    name = f"events-{uid}"
    run("stream", "create", name, "--filter", f"{uid}/ev/#", "--partitions", "2")
    result = run("produce", f"{uid}/ev/1", "-m", "hello", "-m", "world", "--key", "dev-1",
                 "--headers", "source=cli,kind=test", "--qos", "1", "-o", "json")  # fmt: skip
    assert result == {
        "topic": f"{uid}/ev/1",
        "published": 2,
        "destinations": [{"type": "stream", "name": name}],
    }
    assert run("stream", "describe", name, "-o", "json")["messages"] == 2  # counts rose
    out = run("consume", name, "--from-beginning", "--num", "2", "-o", "json").stdout
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["value"] for r in records] == ["hello", "world"]
    assert {r["key"] for r in records} == {"dev-1"} and {r["topic"] for r in records} == {
        f"{uid}/ev/1"
    }
    assert records[0]["headers"] == [
        {"name": "source", "value": "cli", "encoding": "utf8"},
        {"name": "kind", "value": "test", "encoding": "utf8"},
    ]
    plain = run("consume", name, "--from-beginning", "--num", "2", "--print-key").stdout
    assert plain == "dev-1\thello\ndev-1\tworld\n"
    partition = records[0]["partition"]
    only_second = run("consume", name, "--partition", str(partition), "--offset", "1",
                      "--num", "1").stdout  # fmt: skip
    assert only_second == "world\n"
    # Without --from-beginning a consumer starts at the end: nothing old is printed.
    assert run("consume", name, "--timeout", "0.5").stdout == ""


def test_consume_follows_new_messages(run, broker, uid):
    name = f"live-{uid}"
    run("stream", "create", name, "--filter", f"{uid}/live")
    follower = subprocess.Popen(
        [sys.executable, "-m", "flowmq_broker.cli", "consume", name, "--num", "2",
         "--timeout", "30"],
        cwd=broker.data_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # Published until the follower (which starts at the end) has seen two.
        for i in range(40):
            run("produce", f"{uid}/live", "-m", f"m{i}")
            if follower.poll() is not None:
                break
            threading.Event().wait(0.25)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0 and err == "", err
    lines = out.splitlines()
    assert len(lines) == 2 and all(line.startswith("m") for line in lines), out


def test_group_lag_after_consume_and_reset(run, uid):
    name, group = f"billing-{uid}", f"billing-app-{uid}"
    run("stream", "create", name, "--filter", f"{uid}/bill")
    run("produce", f"{uid}/bill", stdin="".join(f"invoice {i}\n" for i in range(5)))
    out = run("consume", name, "--group", group, "--from-beginning", "--num", "3").stdout
    assert out.splitlines() == ["invoice 0", "invoice 1", "invoice 2"]
    described = run("group", "describe", group, "-o", "json")
    assert described["lag"] == 2
    assert [(o["stream"], o["committed_offset"], o["end_offset"], o["lag"])
            for o in described["offsets"]] == [(name, 3, 5, 2)]  # fmt: skip
    listed = run("group", "list", "-o", "json")
    assert [g["members"] for g in listed if g["group"] == group] == [0]
    # The group resumes where it left off.
    assert run("consume", name, "--group", group, "--num", "1").stdout == "invoice 3\n"
    assert run("group", "describe", group, "-o", "json")["lag"] == 1
    reset = run("group", "reset-offsets", group, "--stream", name, "--to", "earliest", "-o", "json")
    assert reset["offsets"] == [{"partition": 0, "offset": 0}]
    assert run("group", "describe", group, "-o", "json")["lag"] == 5
    run("group", "reset-offsets", group, "--stream", name, "--to", "latest")
    assert run("group", "describe", group, "-o", "json")["lag"] == 0
    text = run("group", "describe", group).stdout
    assert "lag" in text and "COMMITTED_OFFSET" in text
    one_line_error(run("group", "reset-offsets", group, "--stream", name, "--to", "soon",
                       code=2), 2, "--to")  # fmt: skip
    one_line_error(run("group", "describe", f"nobody-{uid}", code=1), 1, "nobody")


def test_tail_prints_live_messages(run, broker, uid):
    tail = subprocess.Popen(
        [sys.executable, "-m", "flowmq_broker.cli", "tail", f"{uid}/t/#", "-v", "--num", "2",
         "--timeout", "30"],
        cwd=broker.data_dir.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: any(s["topic_filter"] == f"{uid}/t/#"
                               for s in run("subscription", "list", "-o", "json")), 20,
                   step=0.2, what="the tail's subscription")  # fmt: skip
        run("produce", f"{uid}/t/a", "-m", "21.5", "--qos", "1")
        run("produce", f"{uid}/t/b", "-m", "22.0", "--qos", "0")
        out, err = tail.communicate(timeout=30)
    finally:
        if tail.poll() is None:
            tail.kill()
    assert tail.returncode == 0 and err == "", err
    assert out.splitlines() == [f"{uid}/t/a 21.5", f"{uid}/t/b 22.0"]


def test_tail_without_a_listener_is_one_line(run):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run("tail", "#", "--mqtt", f"127.0.0.1:{port}", code=2)
    one_line_error(done, 2, "MQTT port", str(port))


def test_client_list_and_kick(run, broker, uid):
    client = MqttClient(broker.ports["mqtt"], f"sensor-{uid}")
    try:
        client.subscribe(f"{uid}/cmd/#")
        listed = run("client", "list", "--protocol", "mqtt", "-o", "json")
        mine = [c for c in listed if c["client_id"] == f"sensor-{uid}"]
        assert len(mine) == 1 and mine[0]["subscriptions"] == [f"{uid}/cmd/#"]
        table = run("client", "list").stdout
        assert f"sensor-{uid}" in table and table.startswith("ID ")
        kicked = run("client", "kick", f"sensor-{uid}", "-o", "json")
        assert kicked == {"disconnected": [mine[0]["id"]]}
        assert client.disconnects.get(timeout=TIMEOUT) == 0x98  # administrative action
    finally:
        client.close()
    one_line_error(run("client", "kick", f"sensor-{uid}", code=1), 1, "no client")


def test_subscription_namespace_cluster_and_version(run, broker, uid):
    client = MqttClient(broker.ports["mqtt"], f"sub-{uid}")
    try:
        client.subscribe(f"{uid}/x/+", qos=1)
        subs = run("subscription", "list", "-o", "json")
        assert [(s["topic_filter"], s["qos"]) for s in subs if s["client_id"] == f"sub-{uid}"] == [
            (f"{uid}/x/+", 1)
        ]
    finally:
        client.close()
    ns = f"tenant-{uid}"
    assert run("namespace", "create", ns, "-o", "json")["name"] == ns
    assert ns in [n["name"] for n in run("namespace", "list", "-o", "json")]
    run("stream", "create", "inside", "--namespace", ns)
    assert [s["name"] for s in run("stream", "list", "-n", ns, "-o", "json")] == ["inside"]
    one_line_error(run("namespace", "delete", ns, code=1), 1, ns)  # not empty
    run("stream", "delete", "inside", "-n", ns)
    assert run("namespace", "delete", ns).stdout == f"namespace {ns} deleted\n"

    nodes = run("cluster", "status", "-o", "json")
    assert [(n["node_id"], n["status"], n["self"]) for n in nodes] == [
        (broker.ports["node_id"], "up", True)
    ]
    assert nodes[0]["version"] and "admin" in nodes[0]["roles"]
    assert "1 of 1 node(s) up" in run("cluster", "status").stdout
    version = run("version", "-o", "json")
    assert version["client"] == version["server"] and version["node_id"] == broker.ports["node_id"]


def test_user_verbs_over_the_api(run, uid):
    name = f"svc-{uid}"
    assert run("user", "add", name, stdin="s3cret\n").stdout == f"user {name} saved\n"
    assert [u["namespace"] for u in run("user", "list", "-o", "json") if u["username"] == name] == [
        "default"
    ]
    one_line_error(run("user", "add", name, "--password", "x", code=1), 1, name)
    assert run("user", "passwd", name, "--password", "n3w").stdout.startswith("password of user")
    one_line_error(run("user", "passwd", name, "--password", "", code=2), 2, "empty")
    assert run("user", "delete", name, "-o", "json") == {"deleted": name}
    one_line_error(run("user", "delete", name, code=1), 1, name)


def test_user_with_data_dir_opens_the_meta_store_and_never_creates_one(tmp_path):
    missing = tmp_path / "nothing-here"
    done = flowmq("user", "list", "--data-dir", str(missing), cwd=tmp_path)
    one_line_error(done, 1, "does not exist")
    assert not missing.exists()
    store = tmp_path / "store"
    # Flags after the verb as well as before it.
    assert (
        flowmq("user", "add", "ann", "--password", "pw", "--data-dir", str(store)).returncode == 0
    )
    assert (
        flowmq("user", "--data-dir", str(store), "passwd", "ann", "--password", "pw2").returncode
        == 0
    )
    assert flowmq("user", "list", "--data-dir", str(store)).stdout == "ann\n"
    # Without them it is the admin API, and with no broker that is exit 2.
    done = flowmq("user", "list", cwd=tmp_path, env={"FLOWMQ_URL": "http://127.0.0.1:9"})
    one_line_error(done, 2, "cannot reach")
    assert not (tmp_path / "data").exists()


def test_bad_input_is_one_line_with_the_documented_exit_code(run, broker, tmp_path):
    one_line_error(run("stream", "describe", "no-such-stream", code=1), 1, "does not exist")
    one_line_error(run("stream", "create", "x", "--bogus", code=2), 2, "--bogus")
    one_line_error(run("stream", "create", "x", "--partitions", "many", code=2), 2, "invalid int")
    one_line_error(run("queue", code=2), 2)
    one_line_error(run("stream", "create", "bad name!", code=1), 1, "name")
    one_line_error(run("produce", "-m", "x", code=2), 2, "topic")
    one_line_error(run("produce", "t", "-m", "x", "--headers", "novalue", code=2), 2, "name=value")
    one_line_error(run("consume", "no-such-thing", code=1), 1, "no stream or queue")
    one_line_error(run("stream", "list", "--token", "wrong", code=1), 1, "invalid admin token")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nobody = f"http://127.0.0.1:{port}"
    one_line_error(run("stream", "list", "--url", nobody, code=2), 2, "cannot reach", nobody)
    # A directory with no ./data and no FLOWMQ_URL: the default port, usually nothing there.
    done = flowmq("queue", "list", cwd=tmp_path, env={"FLOWMQ_URL": nobody})
    one_line_error(done, 2, nobody)
    # The environment gives URL and token too.
    env = {"FLOWMQ_URL": broker.http, "FLOWMQ_TOKEN": broker.token}
    done = flowmq("stream", "list", "-o", "json", cwd=tmp_path, env=env)
    assert done.returncode == 0 and isinstance(json.loads(done.stdout), list), done.stderr


def test_cluster_launcher_is_still_the_default(tmp_path):
    done = flowmq("cluster", "--nodes", "0", "--data-dir", str(tmp_path / "c"), cwd=tmp_path)
    assert done.returncode == 2 and "--nodes must be at least 1" in done.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_lists_commands_verbs_and_options(tmp_path):
    script = flowmq("completion", "bash").stdout
    (tmp_path / "flowmq.bash").write_text(script)

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        program = (
            f"source {tmp_path / 'flowmq.bash'}; COMP_WORDS=({line}); "
            f"COMP_CWORD={len(words) - 1}; _flowmq; echo ${{COMPREPLY[@]}}"
        )
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("flowmq", "st") == ["stream"]
    assert set(complete("flowmq", "stream", "")) >= {
        "create",
        "list",
        "describe",
        "update",
        "delete",
    }
    assert complete("flowmq", "consume", "x", "--from") == ["--from-beginning"]
    assert complete("flowmq", "stream", "create", "x", "--part") == ["--partitions"]
    zsh = flowmq("completion", "zsh").stdout
    assert zsh.startswith("#compdef flowmq") and "bashcompinit" in zsh and "_flowmq()" in zsh


def test_help_works_without_a_broker(tmp_path):
    for args in (
        ("--help",),
        ("stream", "--help"),
        ("consume", "--help"),
        ("cluster", "status", "--help"),
    ):
        done = flowmq(*args, cwd=tmp_path)
        assert done.returncode == 0 and "usage: flowmq" in done.stdout, done.stderr
    assert os.listdir(tmp_path) == []
