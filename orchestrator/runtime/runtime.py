"""The runtime: shared actors, many concurrent runs, and the library API.

::

    async with Runtime(config) as runtime:
        handle = await runtime.start(RunSpec(task="Summarise the notes", folder="data"))
        async for event in handle.events():
            print(type(event).__name__)
        result = await handle.result()

Actors are shared by every run (per-run state is keyed by ``run_id``) and started with
``await tg.start(...)``, so the runtime accepts runs only once every subscription exists.
At most ``runtime.max_concurrent_runs`` runs are active; the others wait their turn. Runs
and their watchers run in pooled tasks of the runtime's one task group (a task is reused,
not started per run: :mod:`actors.workers`).
With no ``model.base_url`` configured, the shipped scenarios play the model: in process
when nothing in a scenario needs HTTP (:mod:`orchestrator.sim.inprocess`), else through the
embedded simulator over loopback.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import fields
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, NamedTuple, Self

import anyio
import msgspec
from prometheus_client import CollectorRegistry

from actors.budget.monitor import BudgetMonitor
from actors.context import ContextPolicy, apply_folds, compaction_prompt, summary_message
from actors.context.gatekeeper import ContextGatekeeper
from actors.context.policy import OUTPUT_SHARE
from actors.context.server import ServerEndpoint
from actors.hooks import Hook, HookFunction, HookRunner, check_hooks
from actors.llm.caller import LLMCaller
from actors.llm.settings import endpoint_settings
from actors.loop import PRESETS, LoopConfig
from actors.loop.monitor import LoopMonitor
from actors.loop.presets import OFF
from actors.progress.reporter import ProgressReporter
from actors.tools import ToolExecutorSettings, ToolLimits, ToolRegistry, default_registry
from actors.tools.executor import ToolExecutor
from actors.workers import Workers
from bus import AbortRequested, Bus, ToolSpec
from orchestrator.conductor import (
    Conductor,
    ConductorSettings,
    ContextFunctions,
    RunInputs,
)
from orchestrator.config import (
    Config,
    RunSettings,
    check_tool_choice,
    context_policy,
    merge_loop_overrides,
    request_options,
    run_settings,
)
from orchestrator.errors import ConfigError, RuntimeClosedError
from orchestrator.metrics import MetricsRecorder, RunCounts, new_registry
from orchestrator.metrics.collectors import TOOL_CACHE, ScalarCollector
from orchestrator.result import RunResult, simulator_answered
from orchestrator.runtime.event_log import EventLog
from orchestrator.runtime.folders import SharedFolders
from orchestrator.runtime.handle import RunHandle
from orchestrator.runtime.heap import freeze_long_lived
from orchestrator.runtime.mcp import open_mcp_tools
from orchestrator.runtime.resume import MonitorStates
from orchestrator.runtime.slots import RunSlots
from orchestrator.runtime.spec import ModelActor, RunJournal, RunSpec, StartPoint
from orchestrator.sim import Scenario, ToolDef, open_simulator, shipped_scenarios
from orchestrator.sim.inprocess import InProcessModel
from orchestrator.sim.tools import scripted_tool_from
from orchestrator.tracing import parse_traceparent
from orchestrator.tracing.gen_ai_provider import MODEL_ACTOR_PROVIDER, provider_of
from orchestrator.tracing.wiring import open_tracing, require_tracing

if TYPE_CHECKING:  # the otel/mcp extras: imported at run time only with tracing/[mcp] servers
    from opentelemetry.sdk.trace.export import SpanExporter

    from actors.tools.mcp.servers import McpServers
    from orchestrator.tracing.exporter import TraceExporter

__all__ = ["FOLDER_SYSTEM_PROMPT", "Runtime"]

logger = logging.getLogger("loopfuse.runtime")


KEEP_FINISHED_RUNS: Final = 1_000
"""Finished runs whose events and result a runtime keeps for late readers."""

SHUTDOWN_GRACE_SECONDS: Final = 30.0

FOLDER_SYSTEM_PROMPT: Final = (
    "You work on the files of one folder through the tools you are offered. Paths are "
    'relative to that folder; "." is the folder itself. Call the tools to find what the '
    "task needs, then answer without calling a tool."
)
"""The system message of a run over a folder that brings none of its own. Some servers
show a model its tools only inside a system message (llama-cpp-python's
``chatml-function-calling`` format drops every tool definition from a prompt without one:
a real model then invents paths), and a model told nothing does not know where it is."""


RESOLVED_CACHE_SIZE: Final = 256
"""Distinct run overrides whose resolved settings a runtime keeps (all dropped when full)."""

_OVERRIDES_KEY = msgspec.json.Encoder(order="sorted")


class _Resolved(NamedTuple):
    """A run's overrides resolved against the config (immutable, shared between runs)."""

    settings: RunSettings
    loop: LoopConfig
    policy: ContextPolicy
    tool_specs: tuple[ToolSpec, ...]
    finishing_tools: frozenset[str]
    conductor: ConductorSettings
    folderless_specs: tuple[ToolSpec, ...]
    """``tool_specs`` but those that need a folder: what a run without one is offered."""
    loop_notes: tuple[str, ...] = ()
    """The loop thresholds clamped, a sentence each (the result's ``notes``)."""


CONTEXT_FUNCTIONS: Final = ContextFunctions(
    fold=apply_folds, compaction_prompt=compaction_prompt, summary=summary_message
)
"""How every conductor carries out the context gatekeeper's answers."""


_UNSET: Final = {"int": 0, "float": 0.0}  # an unset (None) budget or price: 0, none
_CONDUCTOR_KEYS: Final = {f.name: _UNSET.get(str(f.type)) for f in fields(ConductorSettings)}
"""The run settings the conductor reads, by their declared names, and their unset value."""


def conductor_settings(
    settings: RunSettings, policy: ContextPolicy | None = None
) -> ConductorSettings:
    """What the conductor reads of ``settings`` (budgets: 0 for none). The context
    ``policy`` caps a reply's ``max_tokens`` at its output reservation and a final
    answer's at a quarter of the window, so a small window's request asks for no more
    than the room kept for it (``docs/context.md``)."""
    reply = settings.max_output_tokens
    answer = settings.answer_max_tokens
    if policy is not None:
        reply = min(reply, max(policy.output_reserve, 1)) if reply is not None else None
        answer = min(answer, max(policy.window // OUTPUT_SHARE, 1))
    named = {key: getattr(settings, key) for key in _CONDUCTOR_KEYS}
    named = {key: _CONDUCTOR_KEYS[key] if value is None else value for key, value in named.items()}
    return ConductorSettings(**named | {"max_output_tokens": reply, "answer_max_tokens": answer})


def tool_executor_settings(config: Config) -> ToolExecutorSettings:
    """The tool executor's limits from ``[tools]``.

    :raises ConfigError: ``tools.image_max_bytes`` does not fit ``tools.max_result_chars``.
    """
    tools = config.tools
    try:
        return ToolExecutorSettings(
            default_timeout_seconds=tools.timeout_seconds,
            max_result_chars=tools.max_result_chars,
            limits=ToolLimits(
                image_max_bytes=tools.image_max_bytes, figure_sandbox=tools.figure_sandbox
            ),
        )
    except ValueError as exc:
        reason = str(exc).removeprefix("limits.image_max_bytes: ")
        raise ConfigError("tools.image_max_bytes", reason) from None


class Runtime:
    """Runs many runs concurrently on one set of shared actors."""

    def __init__(
        self,
        config: Config | None = None,
        *,
        tools: ToolRegistry | None = None,
        scenarios: Sequence[Scenario] = (),
        journal: RunJournal | None = None,
        keep_finished_runs: int = KEEP_FINISHED_RUNS,
        hook_functions: Mapping[str, HookFunction] | None = None,
        metrics_registry: CollectorRegistry | None = None,
        model_actor: Callable[[Bus], ModelActor] | None = None,
        span_exporter: SpanExporter | None = None,
    ) -> None:
        """:param model_actor: builds the actor that answers model requests on this
        runtime's bus, instead of the LLM caller (no endpoint, no simulator).
        :param span_exporter: where spans go with ``[tracing] enabled`` (default: OTLP over
        HTTP, ``docs/tracing.md``), e.g. the SDK's in-memory exporter.
        :raises ConfigError: tracing is enabled but the ``otel`` extra is not installed.
        """
        self.config = config or Config()
        self._span_exporter = span_exporter
        self.tracing: TraceExporter | None = None
        if self.config.tracing.enabled:
            require_tracing()
        self._model_actor = model_actor
        self._journal = journal
        self._keep_finished_runs = keep_finished_runs
        self.bus = Bus()
        self.tools = tools or default_registry()
        self._tool_settings = tool_executor_settings(self.config)
        self._scenario_tools: dict[str, ToolDef] = {}
        self.event_log = EventLog(self.bus)
        # Metrics: this runtime's own registry (serve it at /metrics); the recorder is the
        # only code that touches a metric.
        self.metrics_registry = metrics_registry if metrics_registry is not None else new_registry()
        self.metrics = MetricsRecorder(
            self.bus,
            self.metrics_registry,
            models=(self.config.model.model,),
            tools=self.tools,
            runs=self._run_counts,
        )
        self._extra_scenarios = tuple(scenarios)
        self._slots = RunSlots(self.config.runtime.max_concurrent_runs)
        self._handles: dict[str, RunHandle] = {}
        self._finished: deque[str] = deque()
        self._active = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._live: dict[str, _Resolved] = {}
        """The settings of each active run: what its actors look up at ``RunStarted``."""
        self._resolved: dict[bytes, _Resolved] = {}
        self._pipelines: set[str] = set()  # ids of the pipeline runs among the handles
        self._hook_functions: dict[str, HookFunction] = dict(hook_functions or {})
        self.hook_runner = HookRunner(
            self.bus,
            self._hooks_of,
            self._hook_functions,
            hide_env=(self.config.model.api_key_env, self.config.daemon.token_env),
        )
        self._workers: Workers | None = None  # the tasks runs and watchers run in, reused
        self._stack: AsyncExitStack | None = None
        self.simulator_answers = False
        """No endpoint nor model actor: the embedded simulator answers every run, so a run
        that plays no scenario ends marked ``simulated`` with a note (as the daemon's do)."""
        self.mcp: McpServers | None = None
        """The MCP servers of ``[mcp]`` while the runtime runs (``docs/mcp.md``)."""
        self.scenario_folders = SharedFolders()
        """Scenario folders shared read-only by the runs of a scenario (removed on exit)."""

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            base_url = self.config.model.base_url
            simulated: tuple[Scenario, ...] | None = None
            if base_url is None and self._model_actor is None:
                served = {s.name: s for s in (*shipped_scenarios(), *self._extra_scenarios)}
                self.metrics.add_models(served)  # the simulator's models are scenario names
                self.metrics.add_tools(t.name for s in served.values() for t in s.tools)
                simulator = await stack.enter_async_context(open_simulator(served.values()))
                base_url = simulator.base_url
                simulated = tuple(served.values())
                self.simulator_answers = True
            if self.config.tracing.enabled:
                self.tracing = open_tracing(
                    self.config.tracing,
                    self.bus,
                    self.metrics_registry,
                    stack,
                    base_url=base_url,
                    provider=provider_of(self.config.model.base_url)
                    if self._model_actor is None
                    else MODEL_ACTOR_PROVIDER,
                    exporter=self._span_exporter,
                )
            self.mcp = await stack.enter_async_context(open_mcp_tools(self.config, self.tools))
            if self.mcp is not None:
                self.metrics.add_tools(tool.name for tool in self.mcp.tools)
            tg = await stack.enter_async_context(anyio.create_task_group())
            self._workers = Workers(tg)
            stack.callback(self._workers.close)  # before the task group waits for them
            model = self._model(base_url, simulated)
            loop_monitor = LoopMonitor(self.bus, self._loop_config)
            budget_monitor = BudgetMonitor(self.bus)
            self._monitor_states = MonitorStates({"loop": loop_monitor, "budget": budget_monitor})
            # The context server: the operator's endpoint, asked once per model for its window
            # and tokenizer (never the embedded simulator, never a request's).
            server, url = None, self.config.model.base_url
            if url is not None and self._model_actor is None:
                server = ServerEndpoint(url, os.environ.get(self.config.model.api_key_env, ""))
            self.context_gatekeeper = ContextGatekeeper(self.bus, self._policy_of, server=server)
            executor = self.tool_executor = ToolExecutor(self.bus, self.tools, self._tool_settings)
            self.metrics_registry.register(ScalarCollector(TOOL_CACHE, executor.cache_statistics))
            actors = (
                self.metrics,
                self.event_log,
                budget_monitor,
                loop_monitor,
                ProgressReporter(self.bus),
                executor,
                self.context_gatekeeper,
                model,
                self.hook_runner,
            )
            if self.tracing is not None:
                await tg.start(self.tracing.run)
            for actor in actors:
                await tg.start(actor.run)
            if self.config.runtime.freeze_heap:
                freeze_long_lived(self.config.model.model)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        with anyio.CancelScope(shield=True):
            for handle in list(self._handles.values()):
                if not handle.done:
                    await self._abort(handle, "shutdown", "The runtime is shutting down.")
            with anyio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                await self._idle.wait()
            self.bus.close()
        try:
            return await stack.__aexit__(exc_type, exc, tb)
        finally:
            self.scenario_folders.close()

    def _model(self, base_url: str | None, simulated: tuple[Scenario, ...] | None) -> ModelActor:
        """The actor answering model requests: the caller's own, the LLM caller of the
        endpoint, or (``simulated``: no endpoint) the scenarios played in process with the
        simulator over HTTP for what needs the wire."""
        if self._model_actor is not None:
            return self._model_actor(self.bus)
        model = self.config.model
        options, per_model = request_options(self.config)
        try:
            endpoint = endpoint_settings(
                model,
                base_url=base_url or "",
                api_key=os.environ.get(model.api_key_env, ""),
                options=options,
                models=per_model,
            )
        except ValueError as exc:
            raise ConfigError("model.base_url", str(exc)) from None
        traceparent = self.tracing.traceparent if self.tracing is not None else None
        if simulated is None:
            return LLMCaller(self.bus, endpoint, traceparent=traceparent)
        return InProcessModel(
            self.bus,
            simulated,
            endpoint,
            wire=lambda bus: LLMCaller(bus, endpoint, traceparent=traceparent),
        )

    def _run_counts(self) -> RunCounts:
        running = self._slots.borrowed
        return RunCounts(running, max(self._active - running, 0), self._slots.total)

    def _loop_config(self, run_id: str) -> LoopConfig:
        return live.loop if (live := self._live.get(run_id)) is not None else OFF

    def _policy_of(self, run_id: str) -> ContextPolicy | None:
        return live.policy if (live := self._live.get(run_id)) is not None else None

    def _hooks_of(self, run_id: str) -> tuple[Hook, ...]:
        return live.settings.hooks if (live := self._live.get(run_id)) is not None else ()

    def add_hook_function(self, name: str, function: HookFunction) -> None:
        """Register ``function`` as the Python hook ``name`` (a hook config's ``function``)."""
        self._hook_functions[name] = function

    # ------------------------------------------------------------------ runs

    async def start(
        self,
        spec: RunSpec,
        *,
        on_finished: Callable[[], object] | None = None,
        watch: Callable[[RunHandle], Awaitable[object]] | None = None,
        scenario: bool = False,
    ) -> RunHandle:
        """Accept ``spec`` and return its handle at once; the run starts when a slot frees.

        Without a model (:attr:`simulator_answers`) the result of a run that is not a
        ``scenario``'s (:func:`~orchestrator.scenarios.runs.start_scenario` says so) is
        marked ``simulated``, with a note: the simulator plays scripts, it read neither the
        task nor the folder.

        A run over a folder with tools and no ``spec.system`` (``None``; ``""`` sends none)
        starts with :data:`FOLDER_SYSTEM_PROMPT`, except a scenario's (its model is a
        script).

        ``on_finished`` is called once the run has ended (to release what it used).
        ``watch`` runs beside the run (e.g. to abort it on a condition) until it ends.

        :raises ConfigError: an override names an unknown key or has a bad value.
        :raises RuntimeClosedError: the runtime is not running.
        """
        workers = self._running_workers()
        resolved = self._resolve(spec.overrides)
        settings = resolved.settings
        folder = spec.folder or self.config.tools.folder
        tool_specs = resolved.tool_specs if folder else resolved.folderless_specs
        if tool_specs is not resolved.tool_specs:  # folder tools left out: a forced one too?
            check_tool_choice(self.config, settings.model, tuple(t.name for t in tool_specs))
        system = spec.system
        if system is None and folder and tool_specs and not scenario:
            system = FOLDER_SYSTEM_PROMPT
        run_id, point = self._new_run(spec.run_id)
        traceparent = spec.traceparent or (point and point.traceparent) or ""
        parent = parse_traceparent(traceparent) if traceparent else None
        inputs = RunInputs(
            run_id=run_id,
            trace_id=spec.trace_id
            or (point and point.trace_id)
            or (parent and parent.trace_id)
            or uuid.uuid4().hex,
            traceparent=parent.header() if parent is not None else "",
            resume=point.resume if point is not None else None,
            on_checkpoint=self._monitor_states.saving(self._journal.checkpoint)
            if self._journal is not None
            else None,
            task=spec.task,
            system=system,
            history=spec.history,
            stage=spec.stage,
            plan=spec.plan,
            folder=folder,
            settings=resolved.conductor,
            context=CONTEXT_FUNCTIONS,
            tool_specs=tool_specs,
            finishing_tools=resolved.finishing_tools,
            notes=resolved.loop_notes,
        )
        self._live[run_id] = resolved
        if inputs.resume is not None:  # the fuses go on where they were
            self._monitor_states.restore(run_id, inputs.resume.monitors)
        handle = self._open(run_id, inputs.trace_id)
        simulated = self.simulator_answers and not scenario
        workers.submit(partial(self._run, handle, inputs, on_finished, simulated))
        if watch is not None:
            workers.submit(partial(self._watch, handle, watch))
        return handle

    def _resolve(self, overrides: Mapping[str, Any] | None) -> _Resolved:
        """What ``overrides`` make of the config for a run. Runs started with the same
        overrides share it (all of it is immutable): a run costs neither the conversion
        nor the memory again.

        :raises ConfigError: an override names an unknown key or has a bad value, or an
            unknown tool or hook, or ``tool_choice`` names a tool the run does not have.
        """
        try:
            key: bytes | None = _OVERRIDES_KEY.encode(overrides or {})
        except (TypeError, msgspec.EncodeError):  # not plain data: resolve it every time
            key = None
        found = self._resolved.get(key) if key is not None else None
        if found is not None:
            return found
        settings = run_settings(self.config, overrides)
        loop_notes: list[str] = []
        loop_config = merge_loop_overrides(
            PRESETS.get(settings.loop_preset, OFF),
            settings.loop,
            result_patterns=self.config.loop.result_patterns,
            llm_check_model=self.config.loop.llm_check_model,
            notes=loop_notes,
        )
        unknown = [name for name in settings.tools if self.tools.get(name) is None]
        if unknown:
            raise ConfigError("config.tools", f"unknown tools: {', '.join(unknown)}")
        for hook, reason in check_hooks(settings.hooks, self._hook_functions):
            raise ConfigError(f"config.hooks.{hook}", reason)
        check_tool_choice(self.config, settings.model, settings.tools)
        tool_specs = self.tools.specs(settings.tools)
        folderless = tuple(
            t for t in tool_specs if not ((tool := self.tools.get(t.name)) and tool.needs_folder)
        )
        policy = context_policy(self.config, settings)
        resolved = _Resolved(
            settings,
            loop_config,
            policy,
            tool_specs,
            frozenset(
                name
                for name in settings.tools
                if (tool := self.tools.get(name)) and tool.finishes_stage
            ),
            conductor_settings(settings, policy),
            tool_specs if len(folderless) == len(tool_specs) else folderless,
            tuple(loop_notes),
        )
        if key is not None:
            if len(self._resolved) >= RESOLVED_CACHE_SIZE:
                self._resolved.clear()
            self._resolved[key] = resolved
        return resolved

    async def run(self, spec: RunSpec) -> RunResult:
        """Start ``spec`` and wait for its result."""
        return await (await self.start(spec)).result()

    async def start_pipeline(
        self,
        body: Callable[[str, str], Awaitable[RunResult]],
        *,
        run_id: str | None = None,
        on_finished: Callable[[], object] | None = None,
    ) -> RunHandle:
        """Start a pipeline run: ``body(run_id, trace_id)`` runs its stages (each agent stage
        a run of its own, ``RUN.STAGE``) and returns the pipeline's result. It takes no run
        slot of its own (its stage runs do). The trace id is the journal's for ``run_id``
        (the one the daemon answered with), else a new one. See :mod:`orchestrator.pipeline`.

        :raises RuntimeClosedError: the runtime is not running.
        """
        workers = self._running_workers()
        run_id, point = self._new_run(run_id)
        handle = self._open(run_id, (point and point.trace_id) or uuid.uuid4().hex)
        self._pipelines.add(run_id)
        workers.submit(partial(self._run_pipeline, handle, body, on_finished))
        return handle

    def _running_workers(self) -> Workers:
        """:raises RuntimeClosedError: the runtime is not running."""
        if self._workers is None or self._stack is None:
            raise RuntimeClosedError("the runtime is not running; use `async with Runtime()`")
        return self._workers

    def _new_run(self, run_id: str | None) -> tuple[str, StartPoint | None]:
        """A new run's id (``run_id``, else a fresh one) and start point; :raises ConfigError:."""
        run_id = run_id or uuid.uuid4().hex
        if run_id in self._handles:
            raise ConfigError("run_id", f"a run with id {run_id!r} already exists")
        return run_id, self._journal.start_point(run_id) if self._journal is not None else None

    def _open(self, run_id: str, trace_id: str) -> RunHandle:
        """The handle of a run accepted now (active until :meth:`_close`)."""
        handle = self._handles[run_id] = RunHandle(self, run_id, trace_id)
        self.event_log.open_run(run_id)
        self._active += 1
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        return handle

    def _close(self, handle: RunHandle, on_finished: Callable[[], object] | None) -> None:
        """End ``handle``'s run: release what it used, wake its waiters, keep it a while."""
        if on_finished is not None:
            on_finished()
        handle.status = "finished"
        self._live.pop(handle.run_id, None)
        handle._done.set()
        self._active -= 1
        if self._active == 0:
            self._idle.set()
        self._finished.append(handle.run_id)
        while len(self._finished) > self._keep_finished_runs:
            old = self._finished.popleft()
            self._handles.pop(old, None)
            self._pipelines.discard(old)
            self.event_log.close_run(old)

    async def _run_pipeline(
        self,
        handle: RunHandle,
        body: Callable[[str, str], Awaitable[RunResult]],
        on_finished: Callable[[], object] | None,
    ) -> None:
        try:
            handle.status = "running"
            handle._result = await body(handle.run_id, handle.trace_id)
            handle.trace_id = handle._result.trace_id
        finally:
            self._close(handle, on_finished)

    def add_scenario_tools(self, scenario: Scenario) -> tuple[str, ...]:
        """Register ``scenario``'s scripted tools (once) and return their names.

        :raises ConfigError: another scenario already defined a different tool of that name.
        """
        for definition in scenario.tools:
            known = self._scenario_tools.get(definition.name)
            if known is None:
                self.tools.add(scripted_tool_from(definition))
                self._scenario_tools[definition.name] = definition
            elif known != definition:
                raise ConfigError(
                    f"tools.{definition.name}",
                    f"scenario {scenario.name!r} redefines a tool another scenario defined",
                )
        return tuple(definition.name for definition in scenario.tools)

    def handle(self, run_id: str) -> RunHandle | None:
        """The handle of a run that is active or recently finished."""
        return self._handles.get(run_id)

    @property
    def active_runs(self) -> int:
        return self._active

    async def _run(
        self,
        handle: RunHandle,
        inputs: RunInputs,
        on_finished: Callable[[], object] | None,
        simulated: bool = False,
    ) -> None:
        try:
            await self._slots.acquire()
            try:
                # the first run of a model waits for the server's answer about it (once)
                await self.context_gatekeeper.prepare(
                    inputs.settings.model, inputs.task, inputs.tool_specs
                )
                with self.bus.open_inbox(handle.run_id) as inbox:
                    if handle._abort is not None:
                        inbox.deliver(handle._abort)
                    handle.status = "running"
                    conductor = Conductor(self.bus, inputs, inbox)
                    result = await conductor.run()
                    handle._result = simulator_answered(result) if simulated else result
            finally:
                self._slots.release()
        finally:
            self._close(handle, on_finished)

    @staticmethod
    async def _watch(handle: RunHandle, watch: Callable[[RunHandle], Awaitable[object]]) -> None:
        """Run ``watch`` until ``handle``'s run ends; its failure is logged, never raised."""
        with anyio.CancelScope() as scope:
            handle._done.on_set(scope.cancel)
            try:
                await watch(handle)
            except Exception:
                logger.exception("the watcher of run %s failed", handle.run_id)

    async def _abort(
        self,
        handle: RunHandle,
        source: Literal["caller", "api", "shutdown", "crash"],
        detail: str,
    ) -> None:
        if handle.done or handle._abort is not None:
            return
        handle._abort = AbortRequested(run_id=handle.run_id, source=source, detail=detail)
        if handle.status == "running":
            await self.bus.publish(handle._abort)
        if handle.run_id not in self._pipelines:
            return  # only a pipeline has stage runs; a scan per run made shutdown O(runs²)
        for child_id, child in list(self._handles.items()):  # the pipeline's stage runs
            if child_id.startswith(handle.run_id + ".") and not child.done:
                await self._abort(child, source, detail)
