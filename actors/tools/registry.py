"""Tools and the registry that holds them.

A :class:`Tool` pairs a name and description with a parameters type and a function
``(params, ctx) -> str``: an ``async def``, or a plain ``def`` for a quick, pure tool (the
executor runs it at once, inside its bus handler). Parameters are a frozen msgspec Struct with
``forbid_unknown_fields=True``; the JSON schema sent to the model is generated from it
(:func:`~actors.tools.schema.parameters_schema`). Tools defined by data (the simulator's
scenario files) give a raw JSON schema instead and receive the decoded ``dict``.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec

from actors.tools.context import ToolContext
from actors.tools.errors import ToolError
from actors.tools.schema import argument_checker, inline_refs, parameters_schema
from bus import ToolSpec

__all__ = ["Tool", "ToolFn", "ToolRegistry"]

P = TypeVar("P")
ToolFn = Callable[[P, ToolContext], Awaitable[str]] | Callable[[P, ToolContext], str]
"""A tool's function: ``async (params, ctx) -> str``, or a plain ``(params, ctx) -> str``."""

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENCODE = msgspec.json.Encoder(order="sorted").encode
_DECODE_ANY = msgspec.json.Decoder().decode


class Tool(Generic[P]):
    """A tool the model may call.

    :param name: what the model calls it (``[A-Za-z0-9_-]{1,64}``).
    :param params: a frozen msgspec Struct with ``forbid_unknown_fields=True``.
    :param fn: ``async (params, ctx) -> str``, or a plain ``def (params, ctx) -> str``; raise
        :class:`ToolError` to answer with an error (any other exception is an error result
        too, the same for both kinds).
    :param idempotent: calling it twice with the same arguments gives the same result
        without side effects (a result cache may reuse it).
    :param timeout_seconds: deadline of one call; ``None`` takes the executor's default.
        Only for ``async def`` tools.
    :param finishes_stage: the conductor ends the stage after this tool ran.
    :param needs_folder: it works on the run's folder: a run without one is not offered it.
    :raises ValueError: on a bad name, a parameters type that is not a frozen Struct
        forbidding unknown fields, or ``timeout_seconds`` given to a plain ``def``.

    A plain ``def`` (told apart with :func:`inspect.iscoroutinefunction` here, once;
    :attr:`inline` says which) runs without a task switch: when every call of a reply is
    of such tools (or answered from the result cache), the executor runs them inside its
    bus handler and publishes their results at once. It blocks the event loop while it
    runs, so it cannot be cancelled (an abort waits for it) nor timed out, and every other
    run waits meanwhile: **keep it quick and pure** (no I/O, no sleeping, no heavy work);
    anything that waits or may hang is an ``async def``. A plain callable that returns an
    awaitable is a mistake: its calls are error results ("returned coroutine, not text").
    """

    __slots__ = (
        "_decode",
        "description",
        "finishes_stage",
        "fn",
        "idempotent",
        "inline",
        "name",
        "needs_folder",
        "schema",
        "spec",
        "timeout_seconds",
    )

    def __init__(
        self,
        name: str,
        description: str,
        params: type[P] | _RawSchema,
        fn: ToolFn[P],
        *,
        idempotent: bool = False,
        timeout_seconds: float | None = None,
        finishes_stage: bool = False,
        needs_folder: bool = False,
    ) -> None:
        decode: Callable[[bytes], P]
        if isinstance(params, _RawSchema):  # from from_json_schema, checked there
            schema, decode = params.schema, params.decode
        elif isinstance(params, type) and issubclass(params, msgspec.Struct):
            config = params.__struct_config__
            if not (config.frozen and config.forbid_unknown_fields):
                raise ValueError(
                    f"tool {name!r}: params {params.__name__} must be frozen=True and "
                    "forbid_unknown_fields=True"
                )
            schema, decode = parameters_schema(params), msgspec.json.Decoder(params).decode
        else:
            raise ValueError(f"tool {name!r}: params must be a msgspec Struct type")
        if not _NAME.match(name):
            raise ValueError(f"tool name {name!r} must match {_NAME.pattern}")
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(f"tool {name!r}: timeout_seconds must be positive")
        # A plain def, unless calling ``fn`` gives a coroutine: an ``async def`` function, method
        # or :func:`functools.partial` of one, or an object whose ``__call__`` is one.
        inline = not (
            inspect.iscoroutinefunction(fn)
            or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))
        )
        if inline and timeout_seconds is not None:
            raise ValueError(
                f"tool {name!r}: timeout_seconds needs an async def function (a plain def "
                "runs to its end inside the executor and cannot be timed out)"
            )
        self.name = name
        self.description = description
        self.schema = schema
        self.fn = fn
        self.inline = inline  # a plain def: run at once, no task, no deadline
        self._decode = decode
        self.idempotent = idempotent
        self.timeout_seconds = timeout_seconds
        self.finishes_stage = finishes_stage
        self.needs_folder = needs_folder
        self.spec = ToolSpec(
            name=name, description=description, parameters=_ENCODE(schema).decode()
        )

    @staticmethod
    def from_json_schema(
        name: str,
        description: str,
        schema: Mapping[str, Any],
        fn: ToolFn[dict[str, Any]],
        *,
        idempotent: bool = False,
        timeout_seconds: float | None = None,
        finishes_stage: bool = False,
    ) -> Tool[dict[str, Any]]:
        """A tool whose parameters are a raw JSON object schema; ``fn`` gets a ``dict``.

        Arguments are checked by :mod:`jsonschema` (:func:`~actors.tools.schema.argument_checker`).

        :raises ValueError: on a bad name, a schema that is not an object schema or not a
            valid JSON schema.
        """
        flat = inline_refs(dict(schema))
        if flat.get("type") != "object":
            raise ValueError(f"tool {name!r}: parameters schema must have type 'object'")
        try:
            check = argument_checker(flat)
        except ValueError as exc:
            raise ValueError(f"tool {name!r}: {exc}") from None

        def decode(arguments: bytes) -> dict[str, Any]:
            value = _DECODE_ANY(arguments)
            try:
                check(value)
            except ValueError as exc:
                raise msgspec.ValidationError(str(exc)) from None
            assert isinstance(value, dict)
            return value

        return Tool(
            name,
            description,
            _RawSchema(flat, decode),
            fn,
            idempotent=idempotent,
            timeout_seconds=timeout_seconds,
            finishes_stage=finishes_stage,
        )

    def decode(self, arguments: str) -> P:
        """The parameters in ``arguments`` (JSON text; empty text means ``{}``).

        :raises ToolError: kind ``invalid_arguments``, with msgspec's message (field path
            and reason) so the model can fix its call.
        """
        raw = arguments.strip() or "{}"
        try:
            return self._decode(raw.encode("utf-8", "surrogatepass"))
        except msgspec.ValidationError as exc:
            message = f"invalid arguments for {self.name}: {exc}"
        except (msgspec.DecodeError, UnicodeError, RecursionError) as exc:
            message = f"arguments for {self.name} are not valid JSON: {exc}"
        raise ToolError("invalid_arguments", message)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


class _RawSchema(NamedTuple):
    """What :meth:`Tool.from_json_schema` passes as ``params``: a checked object schema and
    the decoder that checks arguments against it."""

    schema: dict[str, Any]
    decode: Callable[[bytes], Any]


class ToolRegistry:
    """The tools a runtime offers, by name. Runs enable a subset of them."""

    def __init__(self, tools: Iterable[Tool[Any]] = ()) -> None:
        self._tools: dict[str, Tool[Any]] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool[P]) -> Tool[P]:
        """Register ``tool`` and return it.

        :raises ValueError: if a tool of that name is already registered.
        """
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool[Any] | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(sorted(self._tools))

    def specs(self, names: Iterable[str] | None = None) -> tuple[ToolSpec, ...]:
        """The :class:`~bus.ToolSpec` of each of ``names`` (all tools, sorted, when ``None``).

        :raises KeyError: naming an unknown tool and the registered ones.
        """
        wanted = self.names() if names is None else tuple(names)
        for name in wanted:
            if name not in self._tools:
                raise KeyError(f"unknown tool {name!r}; registered: {', '.join(self.names())}")
        return tuple(self._tools[name].spec for name in wanted)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool[Any]]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)
