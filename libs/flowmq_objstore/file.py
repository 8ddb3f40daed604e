"""Local-directory object store: the embedded default (``file:///abs/dir`` or a bare path).

Acknowledged data must survive a crash (DESIGN.md §1), so ``put`` writes a temp file in the
target directory, fsyncs it, renames it over the key and fsyncs the directory; newly created
directories are fsynced into their parents too. Blocking I/O runs in worker threads.

The group-commit batcher's flush thread calls the blocking side directly (``thread_writer``)
and creates its objects ahead (``reserve_blocking``: empty files whose names are made durable
a few flushes before they are written, under write intents that GC honours), so that a
flush's write is one ``write`` + ``fdatasync`` of an already durable name: no temp file, no
rename, no directory fsync on the path of an acknowledgement.  Only the batcher's objects are
written this way; no reader looks at one before an index entry points at it, which the
transaction after the fdatasync writes.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

from flowmq_objstore._common import (
    TEMP_PREFIX,
    RequestHook,
    check_range,
    notify,
    validate_key,
)
from flowmq_objstore.api import ObjectNotFound, ObjectStore, ObjectStoreError

# A concurrent delete may prune the (empty) directory a put is about to write into.
_PUT_DIR_RETRIES = 8


def parse_file_url(url: str) -> str:
    """Absolute directory for ``file:///abs/dir``, ``file://localhost/abs/dir``,
    ``file:/abs/dir`` or a bare (relative or absolute) path."""
    if url[:5].lower() == "file:":
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise ObjectStoreError(
                f"bad object store URL {url!r}: file URLs cannot name a host "
                f"({parts.netloc!r}); use file:///absolute/dir or a bare path"
            )
        if parts.query or parts.fragment:
            raise ObjectStoreError(
                f"bad object store URL {url!r}: file URLs take no query or fragment"
            )
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ObjectStoreError(
                f"bad object store URL {url!r}: a file URL needs an absolute path "
                "(file:///abs/dir); use a bare path for a relative directory"
            )
    else:
        path = url
    if not path or "\x00" in path:
        raise ObjectStoreError(f"bad object store URL {url!r}: empty or invalid path")
    return os.path.abspath(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_existing_ancestor(path: str, root: str) -> None:
    """fsync ``path``, or its nearest ancestor that exists (``root`` at the highest)."""
    while True:
        try:
            _fsync_dir(path)
            return
        except FileNotFoundError:
            if path == root or not path.startswith(root + os.sep):
                raise
            path = os.path.dirname(path)


class FileObjectStore(ObjectStore):
    """Objects are files under ``root``; a key's ``/`` separators become directories.

    A filesystem cannot hold both ``a`` and ``a/b`` (S3 can): such a put fails with
    ObjectStoreError. Temp files left by a crash mid-put are named ``.flowmq-tmp.*``, are
    never listed, and can be removed by any cleanup job once older than a few minutes.
    """

    def __init__(self, root: str | os.PathLike[str], *, on_request: RequestHook | None = None):
        self.root = os.path.abspath(os.fspath(root))
        self.url = Path(self.root).as_uri()
        self._on_request = on_request
        # Keys created empty by ``reserve_blocking`` and not written yet (left out of
        # ``list``).  Plain set operations, atomic under the GIL: threads share it.
        self._reserved: set[str] = set()
        self._prepare_root()

    @classmethod
    def from_url(cls, url: str, *, on_request: RequestHook | None = None) -> FileObjectStore:
        return cls(parse_file_url(url), on_request=on_request)

    def _prepare_root(self) -> None:
        # Fail at startup, naming the path, rather than on the first acknowledged write.
        probe = os.path.join(self.root, f"{TEMP_PREFIX}probe-{uuid.uuid4().hex}")
        try:
            os.makedirs(self.root, exist_ok=True)
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            raise ObjectStoreError(
                f"object store directory {self.root!r} is not usable: {e.strerror or e}"
            ) from None

    def _path(self, key: str) -> str:
        validate_key(key)
        return os.path.join(self.root, *key.split("/"))

    # -- put ---------------------------------------------------------------------------------

    async def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        self._reserved.discard(key)  # a created-ahead file is replaced whole
        size = 0
        try:
            await asyncio.to_thread(self._put_sync, key, path, data)
            size = len(data)
        finally:
            notify(self._on_request, "put", size)

    def thread_writer(self) -> FileObjectStore:
        return self

    def write_blocking(self, key: str, data: bytes) -> None:
        """``put``; for a key made by ``reserve_blocking``, a write and an fdatasync."""
        path = self._path(key)
        size = 0
        try:
            try:
                self._reserved.remove(key)
            except KeyError:
                self._put_sync(key, path, data)
            else:
                self._write_reserved(key, path, data)
            size = len(data)
        finally:
            notify(self._on_request, "put", size)

    def reserve_blocking(self, keys: list[str]) -> None:
        """Create ``keys`` as empty files and make their names durable (one directory fsync
        per directory for all of them), so that ``write_blocking`` of each is a write and an
        fdatasync.  Only under write intents of ``keys``: an empty file left by a crash is
        then an orphan GC deletes."""
        parents: dict[str, None] = {}
        # Listed as reserved before they exist, so ``list`` never shows them empty; a key
        # is written only after this returned (the same thread calls both).
        self._reserved.update(keys)
        try:
            for key in keys:
                path = self._path(key)
                os.close(self._create(path))
                parents[os.path.dirname(path)] = None
            for parent in parents:
                _fsync_dir(parent)
        except (OSError, ObjectStoreError) as e:
            self._reserved.difference_update(keys)  # their writes make whole files
            raise ObjectStoreError(f"creating {keys!r} in {self.url} failed: {e}") from e

    def _write_reserved(self, key: str, path: str, data: bytes) -> None:
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                # The size is part of what fdatasync makes durable; the name already is.
                os.fdatasync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise ObjectStoreError(f"put {key!r} to {self.url} failed: {e}") from e

    def _ensure_dir(self, d: str) -> None:
        if os.path.isdir(d):
            return
        parent = os.path.dirname(d)
        if parent != d:
            self._ensure_dir(parent)
        try:
            os.mkdir(d)
        except FileExistsError:
            return
        _fsync_dir(parent)

    def _create(self, path: str) -> int:
        """A new file at ``path`` (its directories made and made durable), open for writing."""
        parent = os.path.dirname(path)
        for attempt in range(_PUT_DIR_RETRIES):
            self._ensure_dir(parent)
            try:
                return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileNotFoundError:
                if attempt == _PUT_DIR_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _put_sync(self, key: str, path: str, data: bytes) -> None:
        parent = os.path.dirname(path)
        tmp = os.path.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex}")
        try:
            fd = self._create(tmp)
            try:
                with open(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            _fsync_dir(parent)
        except OSError as e:
            raise ObjectStoreError(f"put {key!r} to {self.url} failed: {e}") from e

    # -- get ---------------------------------------------------------------------------------

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        path = self._path(key)
        size = 0
        try:
            data = await asyncio.to_thread(self._get_sync, key, path, start, end)
            size = len(data)
            return data
        finally:
            notify(self._on_request, "get", size)

    def _get_sync(self, key: str, path: str, start: int, end: int | None) -> bytes:
        try:
            # Opened even for an empty range, so a missing key always raises ObjectNotFound.
            with open(path, "rb") as f:
                if end is not None and end <= start:
                    return b""
                if start:
                    f.seek(start)
                return f.read() if end is None else f.read(end - start)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(f"object {key!r} not found in {self.url}") from None
        except OSError as e:
            raise ObjectStoreError(f"get {key!r} from {self.url} failed: {e}") from e

    # -- delete ------------------------------------------------------------------------------

    async def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            await asyncio.to_thread(self._delete_sync, key, path)
        finally:
            notify(self._on_request, "delete", 0)

    def _delete_sync(self, key: str, path: str) -> None:
        self._reserved.discard(key)
        parent = os.path.dirname(path)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except OSError as e:
            raise ObjectStoreError(f"delete {key!r} from {self.url} failed: {e}") from e
        try:
            # A deleted segment coming back after a crash would confuse retention and GC.
            _fsync_dir(parent)
        except FileNotFoundError:
            # A concurrent delete of the directory's last other file pruned it (empty, so
            # after our unlink): make that removal durable instead, in the nearest directory
            # still there; a directory gone for good cannot bring the file back.
            try:
                _fsync_existing_ancestor(os.path.dirname(parent), self.root)
            except OSError as e:
                raise ObjectStoreError(f"delete {key!r} from {self.url} failed: {e}") from e
            return
        except OSError as e:
            raise ObjectStoreError(f"delete {key!r} from {self.url} failed: {e}") from e
        # Prune now-empty directories so per-stream/per-partition trees don't pile up;
        # rmdir refuses non-empty directories, which makes this safe against concurrent puts.
        d = parent
        while d != self.root and d.startswith(self.root + os.sep):
            try:
                os.rmdir(d)
            except OSError:
                break
            d = os.path.dirname(d)

    # -- list --------------------------------------------------------------------------------

    async def list(self, prefix: str = "") -> list[str]:
        try:
            return await asyncio.to_thread(self._list_sync, prefix)
        finally:
            notify(self._on_request, "list", 0)

    def _list_sync(self, prefix: str) -> list[str]:
        # Walk only below the deepest directory the prefix pins down; the rest of the prefix
        # filters names at that level only (a prefix need not end at a directory boundary).
        dir_part, sep, name_prefix = prefix.rpartition("/")
        if dir_part:
            try:
                validate_key(dir_part)
            except ObjectStoreError:
                return []  # no valid key can start with it
            base = os.path.join(self.root, *dir_part.split("/"))
        elif sep:
            return []  # prefix starts with "/": keys never do
        else:
            base = self.root
        keys: list[str] = []
        stack = [(base, dir_part + sep, name_prefix)]
        try:
            while stack:
                d, key_prefix, name_filter = stack.pop()
                try:
                    it = os.scandir(d)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                with it:
                    for entry in it:
                        name = entry.name
                        if name.startswith(TEMP_PREFIX) or not name.startswith(name_filter):
                            continue
                        if entry.is_dir(follow_symlinks=False):
                            stack.append((entry.path, f"{key_prefix}{name}/", ""))
                        elif key_prefix + name not in self._reserved:
                            keys.append(key_prefix + name)
        except OSError as e:
            raise ObjectStoreError(f"list {prefix!r} in {self.url} failed: {e}") from e
        keys.sort()
        return keys

    async def close(self) -> None:
        pass
