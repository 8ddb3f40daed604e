"""Conformance suite for the object store contract (DESIGN.md §8), run against every backend:
the local-directory store and the S3 store talking HTTP to moto's server on loopback.

Range semantics under test, identical on all backends: ``get(key, start, end)`` equals
``whole[start:end]`` for non-negative offsets, i.e. ``end`` past the size is clamped, an empty
or inverted range and a ``start`` at/after the end give ``b""``, yet a missing key always
raises ObjectNotFound; negative offsets raise ValueError.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import flowmq_objstore
import flowmq_objstore.file as file_backend
from flowmq_objstore import (
    FileObjectStore,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    open_object_store,
)
from flowmq_objstore._common import TEMP_PREFIX
from flowmq_objstore.s3 import S3ObjectStore, parse_s3_url
from tests.fixtures.s3 import _FAKE_ENV

# -- the contract, on every backend -----------------------------------------------------------


async def test_put_get_round_trip(store: ObjectStore) -> None:
    await store.put("stream/1/segment-000001", b"hello world")
    assert await store.get("stream/1/segment-000001") == b"hello world"


@pytest.mark.parametrize(
    "key",
    [
        "plain",
        "with space",
        "plus+sign",
        "pct%20literal",
        "query?and#hash",
        "unicode/é/ü-日本",
        ".hidden",
        "a..b",
        "...",
        "dir/.dotfile",
        "back\\slash",
    ],
)
async def test_unusual_but_valid_keys_round_trip(store: ObjectStore, key: str) -> None:
    await store.put(key, key.encode())
    assert await store.get(key) == key.encode()
    assert await store.list() == [key]


async def test_ranged_get_is_slice_semantics(store: ObjectStore) -> None:
    data = bytes(range(256)) * 4 + b"tail"  # 1028 bytes
    await store.put("obj", data)
    n = len(data)
    cases: list[tuple[int, int | None]] = [
        (0, None),
        (10, None),  # start only
        (n - 1, None),
        (n, None),  # start at the end
        (n + 500, None),  # start past the end
        (0, 1),
        (10, 20),  # start + end
        (0, n),
        (0, n + 1),  # end past the size: clamped
        (n - 4, n * 10),
        (20, 20),  # empty range
        (20, 10),  # inverted range
        (n, n),
        (n + 10, n + 20),
        (0, 0),
    ]
    for start, end in cases:
        got = await store.get("obj", start, end)
        assert got == data[start:end], f"range [{start}, {end})"


async def test_ranged_get_of_empty_object(store: ObjectStore) -> None:
    await store.put("empty", b"")
    for start, end in [(0, None), (0, 0), (0, 10), (5, None), (5, 10), (3, 1)]:
        assert await store.get("empty", start, end) == b"", f"range [{start}, {end})"


async def test_negative_range_is_a_caller_error(store: ObjectStore) -> None:
    await store.put("obj", b"abc")
    with pytest.raises(ValueError):
        await store.get("obj", -1)
    with pytest.raises(ValueError):
        await store.get("obj", 0, -1)


async def test_overwrite_replaces_whole_object(store: ObjectStore) -> None:
    await store.put("k", b"x" * 10_000)
    await store.put("k", b"short")
    assert await store.get("k") == b"short"
    assert await store.list() == ["k"]


async def test_get_missing_raises_object_not_found(store: ObjectStore) -> None:
    for start, end in [(0, None), (5, 10), (0, 0), (10, 5)]:
        with pytest.raises(ObjectNotFound):
            await store.get("nope/missing", start, end)
    assert issubclass(ObjectNotFound, ObjectStoreError)


async def test_delete_is_idempotent(store: ObjectStore) -> None:
    await store.delete("never-existed")
    await store.put("d/k", b"v")
    await store.delete("d/k")
    await store.delete("d/k")
    with pytest.raises(ObjectNotFound):
        await store.get("d/k")
    assert await store.list() == []


async def test_list_prefix_and_order(store: ObjectStore) -> None:
    keys = [
        "a/1",
        "a/10",
        "a/2",
        "a/sub/x",
        "ab",
        "b",
        "seg/0001",
        "seg/0002",
        "seg/0010",
        "seg/1000",
        "Z",
        "z",
        "é",
    ]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    for k in shuffled:
        await store.put(k, k.encode())

    def expect(prefix: str) -> list[str]:
        return sorted(k for k in keys if k.startswith(prefix))

    # Code point order == S3's UTF-8 byte order: "Z" < "a" < "z" < "é".
    listed = await store.list()
    assert listed == sorted(keys)
    assert listed[0] == "Z" and listed[-2:] == ["z", "é"]
    for prefix in ["a", "a/", "a/1", "a/s", "a/sub/", "seg/00", "seg/0001", "s", "é", ""]:
        assert await store.list(prefix) == expect(prefix), prefix
    for prefix in ["nope", "a/sub/x/", "seg/0001/", "/a", "../a", "a//"]:
        assert await store.list(prefix) == [], prefix


async def test_zero_byte_object(store: ObjectStore) -> None:
    await store.put("zero", b"")
    assert await store.get("zero") == b""
    assert await store.list() == ["zero"]


async def test_five_megabyte_binary_object(store: ObjectStore) -> None:
    data = os.urandom(5 * 1024 * 1024 + 123)
    await store.put("big/blob.bin", data)
    assert await store.get("big/blob.bin") == data
    mid = len(data) // 2
    assert await store.get("big/blob.bin", mid, mid + 4096) == data[mid : mid + 4096]
    assert await store.get("big/blob.bin", len(data) - 7) == data[-7:]


async def test_concurrent_puts(store: ObjectStore) -> None:
    payloads = {f"c/{i:03d}": os.urandom(1000 + i) for i in range(50)}
    await asyncio.gather(*(store.put(k, v) for k, v in payloads.items()))
    assert await store.list("c/") == sorted(payloads)
    got = await asyncio.gather(*(store.get(k) for k in payloads))
    assert dict(zip(payloads, got, strict=True)) == payloads


async def test_concurrent_overwrites_of_one_key_never_mix(store: ObjectStore) -> None:
    versions = [bytes([i]) * 65_536 for i in range(20)]
    await asyncio.gather(*(store.put("same", v) for v in versions))
    assert await store.get("same") in versions
    assert await store.list() == ["same"]


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/abs",
        "/",
        "a//b",
        "a/",
        ".",
        "..",
        "./a",
        "a/./b",
        "../escape",
        "a/../../escape",
        "nul\x00byte",
        f"{TEMP_PREFIX}x",
        f"dir/{TEMP_PREFIX}x",
        "x" * 256,
        "a/" * 600 + "b",
        "\udcff-lone-surrogate",
    ],
)
async def test_invalid_keys_are_rejected(store: ObjectStore, key: str, tmp_path: Path) -> None:
    for op in (store.put(key, b"v"), store.get(key), store.delete(key)):
        with pytest.raises(ObjectStoreError) as exc:
            await op
        assert not isinstance(exc.value, ObjectNotFound)
    assert await store.list() == []
    # Nothing escaped the file store's root.
    assert not (tmp_path / "escape").exists()


async def test_on_request_hook(store_url: str) -> None:
    calls: list[tuple[str, int]] = []
    store = open_object_store(store_url, on_request=lambda t, n: calls.append((t, n)))
    try:
        await store.put("m/k", b"0123456789")
        assert await store.get("m/k") == b"0123456789"
        assert await store.get("m/k", 2, 5) == b"234"
        assert await store.list("m/") == ["m/k"]
        await store.delete("m/k")
        with pytest.raises(ObjectNotFound):
            await store.get("m/k")
    finally:
        await store.close()
    assert calls == [
        ("put", 10),
        ("get", 10),
        ("get", 3),
        ("list", 0),
        ("delete", 0),
        ("get", 0),
    ]


async def test_broken_hook_does_not_break_storage(store_url: str) -> None:
    def hook(kind: str, size: int) -> None:
        raise RuntimeError("metrics are down")

    store = open_object_store(store_url, on_request=hook)
    try:
        await store.put("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        await store.close()


# -- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("ftp://host/dir", "unsupported scheme 'ftp'"),
        ("memory://", "unsupported scheme 'memory'"),
        ("file://remotehost/dir", "cannot name a host"),
        ("file:relative/dir", "absolute path"),
        ("file:///tmp/x?sync=0", "no query"),
        ("s3://", "bucket"),
        ("s3://?endpoint=http://127.0.0.1:9000", "bucket"),
        ("s3://b", "bucket"),
        ("s3://key:secret@bucket", "credentials"),
        ("s3://bucket?endpoint=ftp://127.0.0.1", "endpoint"),
        ("s3://bucket?endpoint=", "exactly one value"),
        ("s3://bucket?region=a&region=b", "exactly one value"),
        ("s3://bucket?regoin=us-east-1", "unknown parameter(s) regoin"),
        ("s3://bucket?addressing_style=sideways", "addressing_style"),
        ("s3://bucket/../up", "key prefix"),
        ("s3://bucket#frag", "fragment"),
        ("s3://bucket?timeout=0", "timeout"),
        ("s3://bucket?timeout=soon", "timeout"),
    ],
)
def test_bad_urls(url: str, fragment: str) -> None:
    with pytest.raises(ObjectStoreError) as exc:
        open_object_store(url)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("bad object store URL")
    assert fragment in msg


def test_unusable_directory_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    bad = blocker / "objects"
    for url in (str(bad), bad.as_uri()):
        with pytest.raises(ObjectStoreError) as exc:
            open_object_store(url)
        assert str(bad) in str(exc.value)
        assert "\n" not in str(exc.value)


def test_backend_chosen_by_url(tmp_path: Path) -> None:
    assert isinstance(open_object_store(str(tmp_path / "o")), FileObjectStore)
    s3 = open_object_store("s3://bucket?endpoint=http://127.0.0.1:1&region=us-east-1")
    assert isinstance(s3, S3ObjectStore)
    assert flowmq_objstore.S3ObjectStore is S3ObjectStore
    assert s3.url == "s3://bucket?endpoint=http://127.0.0.1:1&region=us-east-1"


# -- file backend -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form", ["file:///", "file://localhost/", "file:/", "bare-abs", "bare-rel", "FILE:///"]
)
async def test_file_url_forms(form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "my dir" / "objects"
    monkeypatch.chdir(tmp_path)
    url = {
        "bare-abs": str(root),
        "bare-rel": "my dir/objects",
        "file:///": root.as_uri(),  # percent-encodes the space
        "FILE:///": "FILE://" + root.as_uri()[len("file://") :],
    }.get(form, form + str(root).lstrip("/"))
    store = open_object_store(url)
    assert isinstance(store, FileObjectStore)
    assert store.root == str(root)
    assert store.url == root.as_uri()
    await store.put("k", b"v")
    assert (root / "k").read_bytes() == b"v"


async def test_file_put_is_durable_and_leaves_no_temp_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileObjectStore(tmp_path / "o")
    synced: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(file_backend.os, "fsync", spy)
    await store.put("new/dir/k", b"v")
    # The file, its directory, and the two directories created on the way.
    assert len(synced) >= 4
    leftovers = [p for p in (tmp_path / "o").rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert leftovers == []


async def test_file_list_ignores_crash_leftovers(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "o")
    await store.put("d/k", b"v")
    (tmp_path / "o" / f"{TEMP_PREFIX}abc").write_bytes(b"partial")
    (tmp_path / "o" / "d" / f"{TEMP_PREFIX}def").write_bytes(b"partial")
    assert await store.list() == ["d/k"]
    assert await store.list("d/") == ["d/k"]


async def test_file_delete_prunes_empty_directories(tmp_path: Path) -> None:
    root = tmp_path / "o"
    store = FileObjectStore(root)
    await store.put("s/p/0001", b"1")
    await store.put("s/q/0001", b"2")
    await store.delete("s/p/0001")
    assert not (root / "s" / "p").exists()
    assert (root / "s" / "q").is_dir()
    await store.delete("s/q/0001")
    assert root.is_dir() and list(root.iterdir()) == []
    # A pruned directory is recreated by the next put.
    await store.put("s/p/0002", b"3")
    assert await store.get("s/p/0002") == b"3"


async def test_file_concurrent_deletes_of_a_directory_s_last_files_all_succeed(
    tmp_path: Path,
) -> None:
    """One delete may prune the directory while another, its file already unlinked, is about
    to fsync that directory: both deletes succeeded (GC counted the second as failed)."""
    root = tmp_path / "o"
    store = FileObjectStore(root)
    for round_ in range(20):
        keys = [f"s/{round_}/{i:04d}" for i in range(8)]
        for key in keys:
            await store.put(key, b"v")
        await asyncio.gather(*(store.delete(key) for key in keys))
        assert not (root / "s" / str(round_)).exists()


async def test_file_key_that_is_a_directory(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "o")
    await store.put("a/b", b"v")
    with pytest.raises(ObjectNotFound):
        await store.get("a")
    await store.delete("a")  # a directory is not an object: no-op
    # Documented limitation: a filesystem can't hold both "a/b" and "a" (S3 can).
    with pytest.raises(ObjectStoreError):
        await store.put("a", b"v")
    with pytest.raises(ObjectStoreError):
        await store.put("a/b/c", b"v")
    assert await store.get("a/b") == b"v"


async def test_file_io_runs_off_the_event_loop(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path / "o")
    loop_thread: list[Any] = []
    real_put_sync = store._put_sync

    def recording_put_sync(*args: Any) -> None:
        loop_thread.append(threading.get_ident())
        real_put_sync(*args)

    store._put_sync = recording_put_sync  # type: ignore[method-assign]
    await store.put("k", b"v")
    assert loop_thread and loop_thread[0] != threading.get_ident()


# -- S3 backend ---------------------------------------------------------------------------------


async def test_s3_objects_are_real_s3_objects(s3_bucket_url: str, s3_client: Any) -> None:
    store = open_object_store(s3_bucket_url)
    bucket = store.bucket  # type: ignore[attr-defined]
    try:
        await store.put("x/y", b"payload")
        body = s3_client.get_object(Bucket=bucket, Key="x/y")["Body"].read()
        assert body == b"payload"
        s3_client.put_object(Bucket=bucket, Key="from-boto3", Body=b"other tool")
        assert await store.get("from-boto3") == b"other tool"
    finally:
        await store.close()


async def test_s3_url_prefix_namespaces_keys(s3_bucket_url: str, s3_client: Any) -> None:
    bucket_part, query = s3_bucket_url.split("?", 1)
    store = open_object_store(f"{bucket_part}/tenant/one/?{query}")
    bucket = store.bucket  # type: ignore[attr-defined]
    try:
        s3_client.put_object(Bucket=bucket, Key="outside", Body=b"not ours")
        s3_client.put_object(Bucket=bucket, Key="tenant/oneish", Body=b"not ours")
        await store.put("k/1", b"v")
        stored = s3_client.list_objects_v2(Bucket=bucket)["Contents"]
        assert sorted(o["Key"] for o in stored) == ["outside", "tenant/one/k/1", "tenant/oneish"]
        assert await store.list() == ["k/1"]
        assert await store.list("k/") == ["k/1"]
        with pytest.raises(ObjectNotFound):
            await store.get("outside")
    finally:
        await store.close()


async def test_s3_list_paginates(s3_bucket_url: str) -> None:
    calls: list[tuple[str, int]] = []
    store = S3ObjectStore(
        **parse_s3_url(s3_bucket_url),
        list_page_size=2,
        on_request=lambda t, n: calls.append((t, n)),
    )
    try:
        keys = [f"p/{i}" for i in range(5)]
        await asyncio.gather(*(store.put(k, b"") for k in keys))
        calls.clear()
        assert await store.list("p/") == keys
        assert calls == [("list", 0)] * 3
    finally:
        await store.close()


async def test_s3_client_is_created_once_and_reused(s3_bucket_url: str) -> None:
    store = open_object_store(s3_bucket_url)
    try:
        await asyncio.gather(*(store.put(f"k{i}", b"v") for i in range(10)))
        client = store._client  # type: ignore[attr-defined]
        assert client is not None
        await store.get("k1")
        assert store._client is client  # type: ignore[attr-defined]
        await store.close()
        assert store._client is None  # type: ignore[attr-defined]
        assert await store.get("k2") == b"v"  # reopens after close
    finally:
        await store.close()


async def test_s3_missing_bucket_is_an_error_not_a_missing_object(s3_server: str) -> None:
    store = open_object_store(f"s3://no-such-bucket-xyz?endpoint={s3_server}&region=us-east-1")
    try:
        with pytest.raises(ObjectStoreError) as exc:
            await store.get("k")
        assert not isinstance(exc.value, ObjectNotFound)
        with pytest.raises(ObjectStoreError):
            await store.put("k", b"v")
        with pytest.raises(ObjectStoreError):
            await store.list()
    finally:
        await store.close()


async def test_s3_unreachable_endpoint(s3_server: str) -> None:
    with socket.socket() as s:  # a port with (almost certainly) nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_object_store(f"s3://bucket?endpoint=http://127.0.0.1:{port}&region=us-east-1")
    try:
        with pytest.raises(ObjectStoreError) as exc:
            await store.get("k")
        assert not isinstance(exc.value, ObjectNotFound)
    finally:
        await store.close()


async def test_a_hung_s3_server_fails_each_call_within_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server that accepts connections and never answers (a hung S3 endpoint) fails every
    call within the configured timeout, retries included, instead of stalling its caller."""
    for name, value in _FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # kept open, never answered

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    store = open_object_store(f"s3://hung?endpoint=http://127.0.0.1:{port}&timeout=0.3")
    try:
        # Bounded at 0.3 * 3 + 2 s plus the client's first creation and a loaded machine's
        # scheduling; without timeouts botocore waits 60 s per attempt.
        ceiling = 10.0
        for call in (lambda: store.put("k", b"v"), lambda: store.get("k")):
            started = time.monotonic()
            with pytest.raises(ObjectStoreError):
                await call()
            elapsed = time.monotonic() - started
            assert elapsed < ceiling, f"a call took {elapsed:.1f} s"
        assert accepted, "the store never reached the server"
    finally:
        await store.close()
        for writer in accepted:
            writer.close()
        server.close()
