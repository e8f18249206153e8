"""How to reach one OpenAI-compatible endpoint, and how hard to try.

:class:`EndpointLimits` (timeouts, retries, deadline) is the one definition of those
settings, their defaults and their ranges: the config's ``[model]`` section extends it, and
:func:`endpoint_settings` hands its values to the LLM caller's :class:`EndpointSettings`.

``api_key`` (and every extra header value) is a secret: the repr hides it and the LLM caller
never logs it nor puts it in a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = [
    "NO_API_KEY",
    "TOOL_CHOICE_MODES",
    "EndpointLimits",
    "EndpointSettings",
    "RequestOptions",
    "Seed",
    "Temperature",
    "ToolChoice",
    "endpoint_settings",
]

NO_API_KEY: Final = "no-key"
"""Sent when ``api_key`` is empty: local servers (and the simulator) ignore it."""

_DAY: Final = 86_400.0
_Seconds = Annotated[float, msgspec.Meta(gt=0, le=_DAY)]
_Grace = Annotated[float, msgspec.Meta(ge=0, le=_DAY)]
_Attempts = Annotated[int, msgspec.Meta(ge=1, le=100)]
Temperature = Annotated[float, msgspec.Meta(ge=0, le=2)]
"""``temperature`` as OpenAI's API bounds it (0 to 2)."""
Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
"""``seed``: a non-negative 64-bit integer."""

TOOL_CHOICE_MODES: Final = ("auto", "none", "required")
"""The ``tool_choice`` values that are not a tool's name."""

_TOOL_CHOICE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ToolChoice = Annotated[str, msgspec.Meta(pattern=_TOOL_CHOICE.pattern)]
"""``"auto"``, ``"none"``, ``"required"`` or a tool's name (a tool name's own pattern)."""


class RequestOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the requests to one model are shaped (``[model]``, ``[models."<id>"]``)."""

    stream: bool = True
    """Stream the reply (``stream: true``, with ``stream_options.include_usage``)."""
    tool_choice: ToolChoice = "auto"
    """Sent with every request that offers tools: ``"auto"``, ``"none"``, ``"required"``
    or a tool's name (that tool is forced)."""
    reset_tool_choice: bool = True
    """Once the model has called a tool, a forcing choice (``"required"`` or a name) is
    sent as ``"auto"``, so a forced call cannot repeat forever."""
    temperature: Temperature | None = None
    """Sampling temperature (``None``: send none, the server decides)."""
    seed: Seed | None = None
    """Sampling seed, for servers that honour one (``None``: send none)."""


class EndpointLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How long to wait for an endpoint and how hard to try.

    The ranges are enforced on decoding (an error names the key and the range); the lower
    bounds also on construction.
    """

    timeout_seconds: _Seconds = 60.0
    """Read/write timeout of one HTTP attempt (reset by every byte, keep-alives included)."""
    connect_timeout_seconds: _Seconds = 5.0
    max_attempts: _Attempts = 4
    """HTTP attempts per request for retryable failures (429, 5xx, timeout, connection, stream)."""
    backoff_base_seconds: _Grace = 0.5
    backoff_cap_seconds: _Grace = 8.0
    retry_after_cap_seconds: _Grace = 30.0
    """A ``Retry-After`` longer than this gives up at once."""
    call_deadline_seconds: _Seconds = 300.0
    """Absolute limit on one request, every attempt and backoff included."""

    def __post_init__(self) -> None:
        for key in ("timeout_seconds", "connect_timeout_seconds", "call_deadline_seconds"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key}: must be > 0, got {getattr(self, key)!r}")
        for key in ("backoff_base_seconds", "backoff_cap_seconds", "retry_after_cap_seconds"):
            if not getattr(self, key) >= 0:
                raise ValueError(f"{key}: must be >= 0, got {getattr(self, key)!r}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts: must be >= 1, got {self.max_attempts!r}")


class EndpointSettings(EndpointLimits, frozen=True, kw_only=True):
    """One endpoint: where it is, its limits, and its token limits.

    Values are checked on construction and on decoding; an error names the key.
    """

    base_url: str
    api_key: str = ""
    default_max_tokens: int | None = None
    """``max_tokens`` when the request names none (``None``: let the server decide)."""
    escalated_max_tokens: int | None = None
    """Retry once with this ``max_tokens`` after ``finish_reason == "length"`` (``None``: never)."""
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    stream: bool = True
    tool_choice: ToolChoice = "auto"
    reset_tool_choice: bool = True
    temperature: Temperature | None = None
    seed: Seed | None = None
    """``stream`` … ``seed``: as :class:`RequestOptions` says, for every model that
    ``models`` does not name."""
    models: dict[str, RequestOptions] = msgspec.field(default_factory=dict)
    """Model name -> its own request options (all three keys, resolved)."""
    extra_headers: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: must be an http(s) URL, got {self.base_url!r}")
        for key in ("default_max_tokens", "escalated_max_tokens"):
            tokens = getattr(self, key)
            if tokens is not None and tokens < 1:
                raise ValueError(f"{key}: must be >= 1 or unset, got {tokens!r}")
        choices = [("tool_choice", self.tool_choice)]
        choices += [(f"models.{m}.tool_choice", o.tool_choice) for m, o in self.models.items()]
        for key, choice in choices:
            if not _TOOL_CHOICE.match(choice):
                raise ValueError(
                    f"{key}: 'auto', 'none', 'required' or a tool's name "
                    f"({_TOOL_CHOICE.pattern}), got {choice!r}"
                )

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in self.__rich_repr__())
        return f"EndpointSettings({fields})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [
            ("base_url", self.base_url),
            ("api_key", "***" if self.api_key else ""),
            ("max_attempts", self.max_attempts),
            ("call_deadline_seconds", self.call_deadline_seconds),
            ("stream", self.stream),
            ("tool_choice", self.tool_choice),
            ("extra_headers", dict.fromkeys(self.extra_headers, "***")),
        ]


def endpoint_settings(
    limits: EndpointLimits,
    *,
    base_url: str,
    api_key: str = "",
    options: RequestOptions | None = None,
    models: Mapping[str, RequestOptions] | None = None,
) -> EndpointSettings:
    """The endpoint at ``base_url`` with the limits of ``limits`` (e.g. the config's
    ``[model]``, which extends :class:`EndpointLimits`): every limit is carried over; its
    request ``options`` and each model's own (``models``).

    :raises ValueError: ``base_url`` is not an http(s) URL, or a limit is out of range.
    """
    values = {name: getattr(limits, name) for name in EndpointLimits.__struct_fields__}
    return EndpointSettings(
        base_url=base_url,
        api_key=api_key,
        models=dict(models or {}),
        **msgspec.structs.asdict(options or RequestOptions()),
        **values,
    )
