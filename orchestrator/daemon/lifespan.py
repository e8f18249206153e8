"""The daemon's lifetime: store, runtime, recorder, recovery and retention, in order.

:meth:`Daemon.running` is what the ASGI lifespan enters. Start-up: open the store and its
writer; start the runtime (``async with Runtime(...)``) with the store as its journal;
start the event recorder; recover the runs a previous process left active; prune old runs.
Only then does the API answer (``/readyz`` says so). Shutdown (:meth:`Daemon.shutdown`,
or the lifespan's end): drain (no new runs; running ones get ``daemon.drain_seconds``;
the rest are aborted with ``abort.shutdown``), end the event streams, leave the runtime,
and commit what the store still holds.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
from prometheus_client import CollectorRegistry

from actors.tools.figure import warn_about_figure_sandbox
from orchestrator.config import Config
from orchestrator.daemon import retention
from orchestrator.daemon.auth import Authenticator
from orchestrator.daemon.metrics import DaemonCollector
from orchestrator.daemon.recorder import EventRecorder
from orchestrator.daemon.recovery import StoreJournal
from orchestrator.daemon.service import RunService
from orchestrator.daemon.store import Store
from orchestrator.daemon.tail import EventTail
from orchestrator.runtime import Runtime
from orchestrator.sim import Scenario, find_scenario, shipped_scenarios

__all__ = ["Daemon", "default_store_path"]

logger = logging.getLogger("loopfuse.daemon")

KEEP_FINISHED_IN_MEMORY: Final = 32
"""Finished runs the runtime keeps in memory; the store has the rest."""


def default_store_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/loopfuse/daemon.db`` (``~/.local/state`` when unset)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "loopfuse" / "daemon.db"


class Daemon:
    """One daemon: its config, and once running its service, store and metrics."""

    def __init__(
        self,
        config: Config,
        *,
        environ: Mapping[str, str] | None = None,
        scenarios: Sequence[Scenario] = (),
    ) -> None:
        self.config = config
        settings = config.daemon
        self.auth = Authenticator.from_environment(
            settings.token_env, metrics_auth=settings.metrics_auth, environ=environ
        )
        self.store_path = (
            Path(settings.store_path) if settings.store_path else default_store_path(environ)
        )
        self.extra_scenarios: tuple[Scenario, ...] = (
            *(find_scenario(path) for path in settings.scenarios),
            *scenarios,
        )
        self.closing = anyio.Event()
        self.ready = False
        self.streams = 0
        self._service: RunService | None = None
        self._store: Store | None = None
        self.registry: CollectorRegistry | None = None

    @property
    def service(self) -> RunService:
        assert self._service is not None, "the daemon is not running"
        return self._service

    @property
    def draining(self) -> bool:
        return self._service is not None and self._service.draining

    @property
    def store(self) -> Store:
        assert self._store is not None, "the daemon is not running"
        return self._store

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Daemon]:
        """Run the daemon for the ``async with`` body (the ASGI lifespan)."""
        settings = self.config.daemon
        tail = EventTail(
            per_run=settings.memory_tail_events, total_bytes=settings.memory_tail_bytes
        )
        store = await anyio.to_thread.run_sync(functools.partial(Store, self.store_path, tail=tail))
        self._store = store
        async with anyio.create_task_group() as outer:
            await outer.start(store.run)
            try:
                journal = StoreJournal(store)
                async with Runtime(
                    self.config,
                    scenarios=self.extra_scenarios,
                    journal=journal,
                    keep_finished_runs=KEEP_FINISHED_IN_MEMORY,
                ) as runtime:
                    store.on_commit = runtime.metrics.observe_store_write
                    recorder = EventRecorder(runtime.bus, store, cap=self.config.daemon.event_cap)
                    await outer.start(recorder.run)
                    async with anyio.create_task_group() as tg:
                        service = RunService(
                            self.config, runtime, store, recorder, journal, self._scenarios(), tg
                        )
                        self._service = service
                        collector = DaemonCollector(service, store, lambda: self.streams)
                        self.registry = runtime.metrics_registry
                        self.registry.register(collector)
                        figure_sandbox = self.config.tools.figure_sandbox
                        await warn_about_figure_sandbox(logger, runtime.tools, figure_sandbox)
                        await service.recover()
                        await retention.prune_now(store, settings)
                        tg.start_soon(retention.keep_pruning, store, settings)
                        self.ready = True
                        ready = {"store": str(self.store_path), "auth": self.auth.enabled}
                        logger.info("ready", extra=ready)
                        yield self
                        await self.shutdown(self.config.daemon.drain_seconds)
                        tg.cancel_scope.cancel()
            finally:
                store.close()
        logger.info("stopped", extra={"store": str(self.store_path)})

    def _scenarios(self) -> dict[str, Scenario]:
        """The scenarios a request may name: none with a model configured (their model is
        the scenario's script, played by the embedded simulator)."""
        if self.config.model.base_url is not None:
            return {}
        return {s.name: s for s in (*shipped_scenarios(), *self.extra_scenarios)}

    async def shutdown(self, drain_seconds: float) -> None:
        """Drain the runs (see :meth:`RunService.drain`), then end every event stream."""
        if self._service is not None and not self.closing.is_set():
            self.ready = False
            await self._service.drain(drain_seconds)
            self.closing.set()
            self.store.wake_all()  # streams waiting for a commit look again, and end
