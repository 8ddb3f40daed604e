"""Issue #11 across OS processes: a consumer group's committed offset never goes back when
an OffsetCommit accepted by a coordinator is written only after the group moved on.

Two brokers ("x", "y") share one SQLite meta store.  Member A of a group coordinated by "x"
commits while another process holds the meta store's write lock, so "x" accepted the commit
but could not write it; "x" is then paused (SIGSTOP) and the lock released.  "y" takes the
group over, member B joins a new generation, reads the committed offset and commits past it.
When "x" resumes, its delayed write of A's older offset must be refused (ILLEGAL_GENERATION)
by the generation check inside that write's transaction, not land over B's.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from flowmq_broker.kafka.cluster import REFRESH_S, KafkaNode, _score, kafka_node_id
from flowmq_cluster.config import GossipConfig
from flowmq_wire.kafka import REQUEST_CLASSES, ErrorCode
from tests.fixtures.broker_process import BrokerProcess, pause
from tests.fixtures.cluster import BrokerCluster, cluster_size, http, metric, wait_for
from tests.fixtures.meta_lock import meta_store_locked
from tests.integration.kafka.conftest import RawKafka

pytestmark = pytest.mark.timeout(120)

NAMES = ("x", "y")
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP = 8, 9, 10, 11, 14
DETECTION_S = GossipConfig().detection_bound(len(NAMES)) + 1.0
# A view follows membership within a refresh; the margin is for a busy machine.  (A CI run
# missed 2 s of it, a full run here 6 s; x, not yet stopped in every thread, had taken the
# released meta lock, and y's meta store waited behind it: ``pause``.)
VIEW_S = REFRESH_S + 6.0
TOPIC = "fenced"
# The paused broker's delayed write must outlive the pause (the defaults give up after 5 s).
PATIENT_META = "?busy_timeout=60&retry_timeout=120"


def owner(key: str) -> str:
    """The node ``key`` maps to among both brokers, as ClusterView.owner computes it."""
    nodes = [KafkaNode(n, kafka_node_id(n), None, 0) for n in NAMES]
    return max(nodes, key=lambda n: _score(key.encode(), n)).name


def coordinator_named_by(broker: BrokerProcess, group: str) -> str:
    client = RawKafka(broker.ports["kafka"])
    try:
        response = client.request(FIND_COORDINATOR, 1, key=group, key_type=0)
    finally:
        client.close()
    return {kafka_node_id(n): n for n in NAMES}.get(response.node_id, "?")


class Member:
    """A group member speaking the raw protocol to one broker."""

    def __init__(self, broker: BrokerProcess, group: str) -> None:
        self.client = RawKafka(broker.ports["kafka"])
        self.group = group
        self.member_id = ""
        self.generation = -1

    def join(self) -> None:
        cls = REQUEST_CLASSES[JOIN_GROUP][5]
        for _ in range(2):  # v5: the first answer hands out the member id (KIP-394)
            joined = self.client.request(
                JOIN_GROUP,
                5,
                group_id=self.group,
                session_timeout_ms=30_000,
                rebalance_timeout_ms=30_000,
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[cls.JoinGroupRequestProtocol(name="range", metadata=b"")],
            )
            self.member_id = joined.member_id
            if joined.error_code != ErrorCode.MEMBER_ID_REQUIRED:
                break
        assert joined.error_code == ErrorCode.NONE, joined
        assert joined.leader == self.member_id  # alone in its generation
        self.generation = joined.generation_id
        cls = REQUEST_CLASSES[SYNC_GROUP][3]
        synced = self.client.request(
            SYNC_GROUP,
            3,
            group_id=self.group,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=None,
            assignments=[cls.SyncGroupRequestAssignment(member_id=self.member_id, assignment=b"")],
        )
        assert synced.error_code == ErrorCode.NONE, synced

    def send_commit(self, offset: int) -> int:
        topic_cls = REQUEST_CLASSES[OFFSET_COMMIT][8].OffsetCommitRequestTopic
        part = topic_cls.OffsetCommitRequestPartition
        return self.client.send(
            OFFSET_COMMIT,
            8,
            group_id=self.group,
            generation_id_or_member_epoch=self.generation,
            member_id=self.member_id,
            group_instance_id=None,
            topics=[
                topic_cls(
                    name=TOPIC,
                    partitions=[part(partition_index=0, committed_offset=offset,
                                     committed_leader_epoch=-1, committed_metadata=None)],
                )
            ],
        )  # fmt: skip

    def commit_answer(self, timeout: float = 30.0) -> int:
        response = self.client.recv(OFFSET_COMMIT, 8, timeout=timeout)
        return response.topics[0].partitions[0].error_code

    def commit(self, offset: int) -> int:
        self.send_commit(offset)
        return self.commit_answer()

    def committed(self) -> int:
        topic_cls = REQUEST_CLASSES[OFFSET_FETCH][7].OffsetFetchRequestTopic
        response = self.client.request(
            OFFSET_FETCH,
            7,
            group_id=self.group,
            topics=[topic_cls(name=TOPIC, partition_indexes=[0])],
            require_stable=False,
        )
        assert response.error_code == ErrorCode.NONE, response
        return response.topics[0].partitions[0].committed_offset


@pytest.fixture
def cluster(tmp_path) -> Iterator[BrokerCluster]:
    made = BrokerCluster(tmp_path, "fencing", NAMES)
    at = made.shared.index("--meta") + 1
    made.shared[at] += PATIENT_META
    try:
        for name in NAMES:
            made.start(name)
        yield made
    finally:
        for proc in made.procs.values():  # a paused broker cannot stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.proc.pid, signal.SIGCONT)
        made.stop_all()


def kafka_requests(broker: BrokerProcess, api: str) -> float:
    return metric(broker.http, "kafka_requests_count", f'api="{api}"')


def test_a_delayed_commit_of_a_deposed_coordinator_is_refused(cluster: BrokerCluster) -> None:
    x, y = cluster["x"], cluster["y"]
    for broker in (x, y):
        wait_for(lambda b=broker: cluster_size(b) == 2, 20, "both brokers see each other")
    group = next(g for i in range(1000) if owner(g := f"fenced-{i}") == "x")
    wait_for(lambda: coordinator_named_by(x, group) == "x", VIEW_S, "x coordinates the group")
    http("POST", f"{x.http}/api/v1/streams", {"name": TOPIC}, cluster.token)

    a = Member(x, group)
    a.join()
    assert a.commit(100) == ErrorCode.NONE
    with meta_store_locked(cluster.root / "meta.db"):
        before = kafka_requests(x, "OffsetCommit")
        a.send_commit(50)  # accepted by x, its write waits for the lock
        wait_for(lambda: kafka_requests(x, "OffsetCommit") > before, 10, "x read the commit")
        # Stopped in every thread before the lock goes: x's meta thread, waiting in SQLite's
        # busy handler, took the lock on its release a few times in ten, and then either
        # wrote the commit of 50 before y's generation (y read 50, not 100) or was stopped
        # holding the write lock (y's meta thread waited behind it: no coordinator view).
        pause(x.proc)

    wait_for(lambda: cluster_size(y) == 1, DETECTION_S, "y sees x gone")
    wait_for(lambda: coordinator_named_by(y, group) == "y", VIEW_S, "y coordinates the group")
    b = Member(y, group)
    b.join()
    assert b.committed() == 100
    assert b.commit(200) == ErrorCode.NONE

    os.kill(x.proc.pid, signal.SIGCONT)
    answer = a.commit_answer(60)  # once x's delayed write transaction ran
    assert b.committed() == 200, "the committed offset went back"
    assert answer == ErrorCode.ILLEGAL_GENERATION
    assert b.generation > a.generation  # generations continue across coordinators
    assert "Traceback" not in cluster.output("x", "y")
