"""S3 object store on aiobotocore: ``s3://bucket[/key/prefix]?endpoint=…&region=…``.

Works against AWS, MinIO, Ceph and moto. Credentials come from botocore's usual chain
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, shared config files, instance roles); they
never go in the URL, which ends up in logs and the admin API.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from flowmq_objstore._common import RequestHook, check_range, notify, validate_key
from flowmq_objstore.api import ObjectNotFound, ObjectStore, ObjectStoreError

_QUERY_PARAMS = ("endpoint", "region", "addressing_style", "timeout")
# Seconds a request attempt may wait to connect or for the next response bytes, and the
# attempts per call (botocore's "standard" retries: exponential backoff with jitter).  A
# whole call is bounded too, so a hung server fails a flush instead of stalling it.
DEFAULT_TIMEOUT_S = 10.0
ATTEMPTS = 3
_ADDRESSING_STYLES = ("path", "virtual", "auto")
# Loose on purpose: legacy us-east-1 buckets allow upper case and underscores.
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
# HEAD responses have no body, so a missing key shows up as a bare "404" (which a missing
# bucket also gives; only the empty-range get uses HEAD).
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def parse_s3_url(url: str) -> dict[str, Any]:
    """Constructor keyword arguments of :class:`S3ObjectStore` for an ``s3://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ObjectStoreError(f"bad object store URL {url!r}: expected an s3:// URL")
    if "@" in parts.netloc:
        raise ObjectStoreError(
            f"bad object store URL {url!r}: credentials do not belong in the URL; "
            "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY instead"
        )
    bucket = parts.netloc
    if not _BUCKET_RE.match(bucket):
        raise ObjectStoreError(
            f"bad object store URL {url!r}: missing or invalid bucket name {bucket!r} "
            "(s3://bucket?endpoint=http://host:port&region=us-east-1)"
        )
    if parts.fragment:
        raise ObjectStoreError(f"bad object store URL {url!r}: s3 URLs take no fragment")
    prefix = unquote(parts.path).strip("/")
    if prefix:
        try:
            validate_key(prefix)
        except ObjectStoreError as e:
            raise ObjectStoreError(f"bad object store URL {url!r}: key prefix: {e}") from None
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ObjectStoreError(f"bad object store URL {url!r}: malformed query string") from None
    unknown = sorted(set(query) - set(_QUERY_PARAMS))
    if unknown:
        raise ObjectStoreError(
            f"bad object store URL {url!r}: unknown parameter(s) {', '.join(unknown)} "
            f"(known: {', '.join(_QUERY_PARAMS)})"
        )
    params: dict[str, str] = {}
    for name, values in query.items():
        if len(values) != 1 or not values[0]:
            raise ObjectStoreError(
                f"bad object store URL {url!r}: parameter {name!r} needs exactly one value"
            )
        params[name] = values[0]
    endpoint = params.get("endpoint")
    if endpoint is not None:
        ep = urlsplit(endpoint)
        if ep.scheme not in ("http", "https") or not ep.hostname:
            raise ObjectStoreError(
                f"bad object store URL {url!r}: endpoint {endpoint!r} must be an "
                "http:// or https:// URL with a host"
            )
    style = params.get("addressing_style")
    if style is not None and style not in _ADDRESSING_STYLES:
        raise ObjectStoreError(
            f"bad object store URL {url!r}: addressing_style must be one of "
            f"{', '.join(_ADDRESSING_STYLES)}"
        )
    timeout = DEFAULT_TIMEOUT_S
    if "timeout" in params:
        try:
            timeout = float(params["timeout"])
        except ValueError:
            timeout = 0.0
        if not 0 < timeout <= 3600:
            raise ObjectStoreError(
                f"bad object store URL {url!r}: timeout must be seconds in (0, 3600]"
            )
    return {
        "bucket": bucket,
        "prefix": prefix,
        "endpoint_url": endpoint,
        "region": params.get("region"),
        "addressing_style": style,
        "timeout": timeout,
    }


def _error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


class S3ObjectStore(ObjectStore):
    """Keys map to ``<prefix>/<key>`` in ``bucket``; ``list`` strips the prefix again.

    One aiobotocore client is created on first use and reused (it pools connections);
    ``close()`` releases it, and a later call would create a new one.
    """

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        on_request: RequestHook | None = None,
        list_page_size: int | None = None,
        max_pool_connections: int = 32,
        url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.region = region
        # Virtual-host addressing needs wildcard DNS that MinIO/Ceph/moto setups rarely have.
        self.addressing_style = addressing_style or ("path" if endpoint_url else "auto")
        self.url = url or f"s3://{bucket}/{self.prefix}"
        self._on_request = on_request
        self._list_page_size = list_page_size
        self._max_pool_connections = max_pool_connections
        self._client: Any = None
        self._client_cm: Any = None
        self._client_lock = asyncio.Lock()
        self.timeout = timeout
        # Every attempt may take its full timeout, plus the backoff between attempts.
        self._call_timeout = timeout * ATTEMPTS + 2.0

    @classmethod
    def from_url(cls, url: str, *, on_request: RequestHook | None = None) -> S3ObjectStore:
        return cls(**parse_s3_url(url), on_request=on_request, url=url)

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                config = AioConfig(
                    s3={"addressing_style": self.addressing_style},
                    max_pool_connections=self._max_pool_connections,
                    retries={"mode": "standard", "max_attempts": ATTEMPTS},
                    connect_timeout=self.timeout,
                    read_timeout=self.timeout,
                    # botocore >= 1.36 adds CRC trailers by default, which older MinIO and
                    # Ceph reject; only send/verify checksums where the API demands them.
                    request_checksum_calculation="when_required",
                    response_checksum_validation="when_required",
                    # Loading the S3 service model is ~tens of ms of JSON parsing: do it in a
                    # thread instead of on the event loop.
                    warm_up_loader_caches=True,
                )
                cm = get_session().create_client(
                    "s3", region_name=self.region, endpoint_url=self.endpoint_url, config=config
                )
                try:
                    client = await cm.__aenter__()
                except (BotoCoreError, ClientError) as e:
                    raise ObjectStoreError(f"cannot create S3 client for {self.url}: {e}") from e
                self._client_cm, self._client = cm, client
        return self._client

    def _key(self, key: str) -> str:
        validate_key(key)
        return self.prefix + key

    @contextlib.asynccontextmanager
    async def _bounded(self, op: str, key: str) -> AsyncIterator[None]:
        """One call, retries included, within ``_call_timeout``."""
        try:
            async with asyncio.timeout(self._call_timeout):
                yield
        except TimeoutError:
            raise ObjectStoreError(
                f"{op} {key!r} on {self.url} timed out after {self._call_timeout:.0f} s"
            ) from None

    def _error(self, op: str, key: str, e: Exception) -> ObjectStoreError:
        if isinstance(e, ClientError) and _error_code(e) in _NOT_FOUND_CODES:
            return ObjectNotFound(f"object {key!r} not found in {self.url}")
        return ObjectStoreError(f"{op} {key!r} on {self.url} failed: {e}")

    async def put(self, key: str, data: bytes) -> None:
        s3_key = self._key(key)
        client = await self._get_client()
        size = 0
        try:
            async with self._bounded("put", key):
                await client.put_object(Bucket=self.bucket, Key=s3_key, Body=data)
            size = len(data)
        except (BotoCoreError, ClientError) as e:
            raise self._error("put", key, e) from e
        finally:
            notify(self._on_request, "put", size)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_range(start, end)
        s3_key = self._key(key)
        client = await self._get_client()
        size = 0
        try:
            async with self._bounded("get", key):
                data = await self._get(client, s3_key, start, end)
            size = len(data)
            return data
        except (BotoCoreError, ClientError) as e:
            raise self._error("get", key, e) from e
        finally:
            notify(self._on_request, "get", size)

    async def _get(self, client: Any, s3_key: str, start: int, end: int | None) -> bytes:
        if end is not None and end <= start:
            # An HTTP Range cannot be empty; HEAD keeps "missing key raises" consistent.
            await client.head_object(Bucket=self.bucket, Key=s3_key)
            return b""
        kwargs: dict[str, Any] = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=s3_key, **kwargs)
        except ClientError as e:
            if _error_code(e) == "InvalidRange":
                return b""  # start at or past the end of an existing object
            raise
        async with resp["Body"] as body:
            data: bytes = await body.read()
        if kwargs and "ContentRange" not in resp:
            # Some S3 look-alikes ignore Range and send the whole object.
            data = data[start:end]
        return data

    async def delete(self, key: str) -> None:
        s3_key = self._key(key)
        client = await self._get_client()
        try:
            # S3 answers 204 for a missing key too, which is exactly the contract.
            async with self._bounded("delete", key):
                await client.delete_object(Bucket=self.bucket, Key=s3_key)
        except (BotoCoreError, ClientError) as e:
            raise self._error("delete", key, e) from e
        finally:
            notify(self._on_request, "delete", 0)

    async def list(self, prefix: str = "") -> list[str]:
        client = await self._get_client()
        strip = len(self.prefix)
        keys: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix}
        if self._list_page_size:
            kwargs["MaxKeys"] = self._list_page_size
        # Paginated by hand so the metrics hook sees every HTTP request.
        while True:
            try:
                async with self._bounded("list", prefix):
                    resp = await client.list_objects_v2(**kwargs)
            except (BotoCoreError, ClientError) as e:
                raise ObjectStoreError(f"list {prefix!r} on {self.url} failed: {e}") from e
            finally:
                notify(self._on_request, "list", 0)
            keys.extend(obj["Key"][strip:] for obj in resp.get("Contents", ()))
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                break
            kwargs["ContinuationToken"] = token
        # S3 already sorts by UTF-8 bytes (= code point order); sort anyway for look-alikes.
        keys.sort()
        return keys

    async def close(self) -> None:
        cm, self._client_cm, self._client = self._client_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)
