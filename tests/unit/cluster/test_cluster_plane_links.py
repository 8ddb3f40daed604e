"""The closed cluster plane on inter-broker links (DESIGN.md §12): a challenge-response on the
secret before any frame; a connection that fails it, or sends anything else first, is closed,
counted in cluster_auth_failures_count{plane="link"} and logged once per address; no frame of
ours goes to a peer that has not proved itself.  Real TCP on 127.0.0.1; the raw clients and
servers below speak the wire format by hand (``flowmq_cluster.auth`` docstring)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

import flowmq_metrics as metrics
from flowmq_cluster import ClusterSecret, link
from flowmq_cluster.link import Links
from tests.fixtures.waiting import wait_until_async

SECRET_TEXT = "unit-test-cluster-secret-one"
SECRET = ClusterSecret(SECRET_TEXT)
OTHER = ClusterSecret("unit-test-cluster-secret-two")


def proof(secret_text: str, initiator_nonce: bytes, acceptor_nonce: bytes, node: str, role: str):
    """A handshake proof computed from the documented format, not with the code under test."""
    key = hmac.new(secret_text.encode(), b"flowmq link v1", hashlib.sha256).digest()
    data = msgpack.packb(
        ["flowmq-link-v1", initiator_nonce, acceptor_nonce, node, role], use_bin_type=True
    )
    return hmac.new(key, data, hashlib.sha256).digest()


def pack(frame: Any) -> bytes:
    return msgpack.packb(frame, use_bin_type=True)


class Raw:
    """A hand-driven TCP peer: frames read one at a time, bytes written as given."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.unpacker = msgpack.Unpacker(raw=False)

    @classmethod
    async def connect(cls, port: int) -> Raw:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def frame(self, timeout: float = 5) -> Any:
        while True:
            try:
                return next(self.unpacker)
            except StopIteration:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
                if not data:
                    raise EOFError from None
                self.unpacker.feed(data)

    async def rest(self, timeout: float = 5) -> list[Any]:
        """Every frame until the other end closes (fails the test if it does not)."""
        frames = list(self.unpacker)
        while True:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except ConnectionResetError:
                return frames
            if not data:
                return frames
            self.unpacker.feed(data)
            frames.extend(self.unpacker)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def close(self) -> None:
        self.writer.close()


class Server:
    """A ``Links`` listener whose frames are recorded."""

    def __init__(self, secret: ClusterSecret | None = SECRET) -> None:
        self.got: list[Any] = []
        self.arrived = asyncio.Event()
        self.links = Links("server", self._on_frame, secret=secret)
        self.port = 0

    def _on_frame(self, link_: Any, frame: Any) -> None:
        self.got.append(frame)
        self.arrived.set()

    async def __aenter__(self) -> Server:
        self.port = await self.links.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.links.stop()

    @property
    def failures(self) -> int:
        return self.links.auth_failures.count


FORWARD = ["fwd", "default", b"forged message", True, []]


async def handshake(raw: Raw, secret_text: str = SECRET_TEXT) -> bytes:
    """Do the initiator's side by hand; returns the server's nonce."""
    hello = await raw.frame()
    assert hello[0] == "hello" and hello[1] == "server" and len(hello[2]) == 16
    mine = os.urandom(16)
    raw.send(pack(["hello", "raw", mine]))
    raw.send(pack(["proof", proof(secret_text, mine, hello[2], "raw", "initiator")]))
    answer = await raw.frame()
    assert answer == ["proof", proof(secret_text, mine, hello[2], "server", "acceptor")]
    # Then each side names its process (incarnation) before any other frame.
    assert (await raw.frame())[0] == "incarnation"
    raw.send(pack(["incarnation", "raw-process"]))
    return hello[2]


async def test_a_hand_made_handshake_lets_frames_through():
    """Positive control for the refusals below: the documented handshake works."""
    async with Server() as server:
        raw = await Raw.connect(server.port)
        await handshake(raw)
        raw.send(pack(FORWARD))
        await asyncio.wait_for(server.arrived.wait(), 5)
        assert server.got == [FORWARD] and server.failures == 0
        raw.close()


def _attempts() -> dict[str, Callable[[bytes], list[bytes]]]:
    """What an unauthenticated client sends, given the server's nonce."""
    mine = os.urandom(16)
    hello = pack(["hello", "raw", mine])

    def right(nonce: bytes) -> bytes:
        return proof(SECRET_TEXT, mine, nonce, "raw", "initiator")

    return {
        "a frame first": lambda nonce: [pack(FORWARD)],
        "a frame after the hello": lambda nonce: [hello, pack(FORWARD)],
        "a hello without a nonce": lambda nonce: [pack(["hello", "raw"]), pack(FORWARD)],
        "a proof under another secret": lambda nonce: [
            hello,
            pack(["proof", proof("unit-test-cluster-secret-two", mine, nonce, "raw", "initiator")]),
            pack(FORWARD),
        ],
        "a proof from another connection": lambda nonce: [
            hello,
            pack(["proof", proof(SECRET_TEXT, mine, os.urandom(16), "raw", "initiator")]),
            pack(FORWARD),
        ],
        "a proof in the acceptor's role (reflected)": lambda nonce: [
            hello,
            pack(["proof", proof(SECRET_TEXT, mine, nonce, "raw", "acceptor")]),
            pack(FORWARD),
        ],
        "a proof for another node id": lambda nonce: [
            hello,
            pack(["proof", proof(SECRET_TEXT, mine, nonce, "other", "initiator")]),
            pack(FORWARD),
        ],
        "two hellos": lambda nonce: [hello, hello, pack(["proof", right(nonce)]), pack(FORWARD)],
        "bytes that are not msgpack": lambda nonce: [b"\xc1" * 8],
        "an endless handshake": lambda nonce: [b"\xc6\x00\x10\x00\x00" + b"x" * 5000],
    }


@pytest.mark.parametrize("attempt", list(_attempts()))
async def test_a_connection_without_the_handshake_is_closed_counted_and_delivers_nothing(attempt):
    async with Server() as server:
        before = metrics.cluster_auth_failures_count.value("link")
        raw = await Raw.connect(server.port)
        hello = await raw.frame()
        for data in _attempts()[attempt](hello[2]):
            raw.send(data)
        assert await raw.rest() == []  # closed, and no proof of the server's was sent
        await wait_until_async(lambda: server.failures == 1)
        assert server.got == []
        assert metrics.cluster_auth_failures_count.value("link") - before == 1


async def test_a_connection_that_does_not_complete_the_handshake_in_time_is_closed(monkeypatch):
    monkeypatch.setattr(link, "HANDSHAKE_TIMEOUT_S", 0.2)
    async with Server() as server:
        raw = await Raw.connect(server.port)
        hello = await raw.frame()
        raw.send(pack(["hello", "raw", os.urandom(16)]))  # and then nothing
        assert await raw.rest() == []
        assert server.failures == 1 and hello[0] == "hello"


async def test_failures_are_logged_once_per_address(caplog):
    caplog.set_level(logging.WARNING, logger="flowmq.cluster.auth")
    async with Server() as server:
        for _ in range(5):
            raw = await Raw.connect(server.port)
            raw.send(pack(FORWARD))
            await raw.rest()
        await wait_until_async(lambda: server.failures == 5)
    lines = [r.getMessage() for r in caplog.records if "127.0.0.1" in r.getMessage()]
    assert len(lines) == 1 and "link" in lines[0], lines


@pytest.mark.parametrize("client_secret", [OTHER, None], ids=["another secret", "no secret"])
async def test_links_with_the_same_secret_carry_frames_others_do_not(client_secret):
    async with Server() as server:
        good = Links("good", lambda link_, frame: None, secret=SECRET)
        bad = Links("bad", lambda link_, frame: None, secret=client_secret)
        try:
            for client in (bad, good):
                client.set_peer("server", ("127.0.0.1", server.port))
                assert client.send("server", ["n", client.node_id])
            await asyncio.wait_for(server.arrived.wait(), 5)  # the same secret gets through
            await wait_until_async(lambda: server.failures >= 1)  # bad was refused
            assert server.got == [["n", "good"]]
            if client_secret is not None:  # the refused side counts it too
                assert bad.auth_failures.count >= 1
        finally:
            await bad.stop()
            await good.stop()


async def _fake_acceptor(
    send_proof: Callable[[bytes, bytes], bytes], received: asyncio.Future[list[Any]]
) -> asyncio.Server:
    """A hand-driven acceptor that proves itself with ``send_proof(initiator nonce, own
    nonce)``; ``received`` gets the client's frames up to its first other frame or its close."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = Raw(reader, writer)
        nonce = os.urandom(16)
        raw.send(pack(["hello", "fake", nonce]))
        frames = [await raw.frame(), await raw.frame()]  # the client's hello and proof
        raw.send(pack(["proof", send_proof(frames[0][2], nonce)]))
        raw.send(pack(["incarnation", "fake-process"]))
        try:
            frames.append(await raw.frame())  # the client's incarnation
            frames.append(await raw.frame())
        except (EOFError, ConnectionResetError):
            pass
        if not received.done():
            received.set_result(frames)
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


@pytest.mark.parametrize("honest", [True, False], ids=["proves itself", "wrong proof"])
async def test_no_frame_of_ours_goes_to_a_peer_that_did_not_prove_itself(honest):
    secret = SECRET_TEXT if honest else "unit-test-cluster-secret-two"
    received: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    fake = await _fake_acceptor(
        lambda theirs, ours: proof(secret, theirs, ours, "fake", "acceptor"), received
    )
    client = Links("client", lambda link_, frame: None, secret=SECRET)
    try:
        client.set_peer("fake", ("127.0.0.1", fake.sockets[0].getsockname()[1]))
        assert client.send("fake", ["n", "for the peer only"])
        frames = await asyncio.wait_for(received, 5)
        assert [frame[0] for frame in frames] == (
            ["hello", "proof", "incarnation", "n"] if honest else ["hello", "proof"]
        )
        if not honest:
            await wait_until_async(lambda: client.auth_failures.count >= 1)
    finally:
        await client.stop()
        fake.close()
