"""Connecting to NATS, creating the fleet's streams and buckets, and retrying through outages."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, NamedTuple, TypeVar

import anyio
import msgspec
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NotFoundError
from nats.js.kv import KeyValue

from orchestrator.cluster.settings import ClusterSettings
from orchestrator.errors import ConfigError

__all__ = ["Buckets", "bucket_keys", "connect", "ensure_layout", "retrying"]

logger = logging.getLogger("loopfuse.cluster")

T = TypeVar("T")

FIRST_CONNECT_SECONDS: Final = 10.0
"""How long a daemon's first connection to NATS may take (later ones are retried for ever)."""
RETRY_FIRST: Final = 0.05
RETRY_MAX: Final = 1.0
EVENTS_PER_RUN: Final = 100_000
"""Cap on one run's messages in the events stream (older ones go first)."""
JS_API: Final = "$JS.API"
"""JetStream's API subjects, as ``nc.jetstream()`` (no domain, no prefix) addresses them."""


class _SubjectCounts(msgspec.Struct):
    subjects: dict[str, int] | None = None


class _StreamSubjects(msgspec.Struct):
    """The part of a ``STREAM.INFO`` answer a key listing reads."""

    state: _SubjectCounts = msgspec.field(default_factory=_SubjectCounts)
    total: int = 0
    error: dict[str, Any] | None = None


class Buckets(NamedTuple):
    """The fleet's key-value buckets."""

    state: KeyValue
    checkpoints: KeyValue
    nodes: KeyValue


async def connect(settings: ClusterSettings, *, name: str) -> Client:
    """A connection that reconnects for ever (a NATS restart must not end a daemon)."""

    async def disconnected() -> None:
        logger.warning("nats disconnected", extra={"node": name})

    async def reconnected() -> None:
        logger.info("nats reconnected", extra={"node": name})

    async def error(exc: Exception) -> None:
        logger.debug("nats: %s", exc, extra={"node": name})

    # nats-py retries a first connection for ever when reconnects are unbounded: a daemon
    # started without its NATS would wait, silently, until killed.
    try:
        with anyio.fail_after(FIRST_CONNECT_SECONDS):
            return await nats.connect(
                settings.nats_url,
                name=name,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,
                connect_timeout=5,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                error_cb=error,
            )
    except TimeoutError:
        raise ConfigError(
            "cluster.nats_url",
            f"no NATS server answered at {settings.nats_url} within {FIRST_CONNECT_SECONDS:g} s: "
            "start it (docs/scale-out.md), or fix --nats / cluster.nats_url",
        ) from None


async def ensure_layout(js: JetStreamContext, settings: ClusterSettings) -> Buckets:
    """Create the streams and buckets the fleet needs (idempotent; the first daemon wins)."""
    runs = StreamConfig(
        name=settings.runs_stream,
        subjects=[settings.submit_subject],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=settings.duplicate_window_seconds,
    )
    events = StreamConfig(
        name=settings.events_stream,
        subjects=[settings.events_subject("*")],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=settings.events_max_age_seconds,
        max_msgs_per_subject=EVENTS_PER_RUN,
        discard=DiscardPolicy.OLD,
        duplicate_window=settings.duplicate_window_seconds,
    )
    for name, config in ((settings.runs_stream, runs), (settings.events_stream, events)):
        try:
            await js.stream_info(name)
        except NotFoundError:
            await js.add_stream(config)
    return Buckets(
        state=await _bucket(js, KeyValueConfig(bucket=settings.state_bucket, history=1)),
        checkpoints=await _bucket(js, KeyValueConfig(bucket=settings.checkpoint_bucket)),
        nodes=await _bucket(
            js, KeyValueConfig(bucket=settings.nodes_bucket, ttl=settings.node_ttl_seconds)
        ),
    )


async def bucket_keys(nc: Client, bucket: str) -> list[str]:
    """The keys key-value ``bucket`` holds, deleted ones too (a delete leaves a marker
    entry): the subjects of its stream, from ``STREAM.INFO`` with a subject filter, page by
    page (NATS answers at most 100,000 subjects at a time and says how many match).

    Not ``KeyValue.keys()``: its watcher can send its end-of-history marker before the
    entries already delivered to it (nats-io/nats.py#842, still in 2.16), and a bucket that
    holds keys then lists none. nats-py's ``stream_info`` cannot ask for a page past the
    first, so the request is sent here.
    """
    prefix = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        request = {"subjects_filter": prefix + ">", "offset": len(keys)}
        reply = await nc.request(
            f"{JS_API}.STREAM.INFO.KV_{bucket}", msgspec.json.encode(request), timeout=5
        )
        page = msgspec.json.decode(reply.data, type=_StreamSubjects)
        if page.error is not None:
            APIError.from_error(page.error)  # raises NotFoundError, BadRequestError, …
        subjects = page.state.subjects or {}
        keys.extend(subject[len(prefix) :] for subject in subjects)
        if not subjects or len(keys) >= page.total:
            return keys


async def _bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    try:
        return await js.key_value(config.bucket)
    except NotFoundError:
        return await js.create_key_value(config)


async def retrying(
    what: str, call: Callable[[], Awaitable[T]], *, attempts: int | None = None
) -> T:
    """``await call()`` until it succeeds: NATS errors (a restart, a reconnect, a timeout)
    are retried with backoff; nothing accepted is dropped because NATS was away. With
    ``attempts``, the last error is raised after that many tries."""
    delay = RETRY_FIRST
    tries = 0
    while True:
        tries += 1
        try:
            return await call()
        except (nats.errors.Error, TimeoutError) as exc:
            # NotFound, BadRequest: an answer, not an outage; or the last of ``attempts`` tries.
            if isinstance(exc, NotFoundError | BadRequestError) or tries == attempts:
                raise
            logger.info("retrying %s: %s", what, type(exc).__name__)
            await anyio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
