"""How to reach one OpenAI-compatible endpoint, and how hard to try.

:class:`EndpointLimits` (timeouts, retries, deadline) is the one definition of those
settings, their defaults and their ranges: the config's ``[model]`` section extends it, and
:func:`endpoint_settings` hands its values to the LLM caller's :class:`EndpointSettings`.

``api_key`` (and every extra header value) is a secret: the repr hides it and the LLM caller
never logs it nor puts it in a message.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

__all__ = ["NO_API_KEY", "EndpointLimits", "EndpointSettings", "endpoint_settings"]

NO_API_KEY: Final = "no-key"
"""Sent when ``api_key`` is empty: local servers (and the simulator) ignore it."""

_DAY: Final = 86_400.0
_Seconds = Annotated[float, msgspec.Meta(gt=0, le=_DAY)]
_Grace = Annotated[float, msgspec.Meta(ge=0, le=_DAY)]
_Attempts = Annotated[int, msgspec.Meta(ge=1, le=100)]


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
        positive = {
            "timeout_seconds": self.timeout_seconds,
            "connect_timeout_seconds": self.connect_timeout_seconds,
            "call_deadline_seconds": self.call_deadline_seconds,
        }
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"{key}: must be > 0, got {value!r}")
        non_negative = {
            "backoff_base_seconds": self.backoff_base_seconds,
            "backoff_cap_seconds": self.backoff_cap_seconds,
            "retry_after_cap_seconds": self.retry_after_cap_seconds,
        }
        for key, value in non_negative.items():
            if not value >= 0:
                raise ValueError(f"{key}: must be >= 0, got {value!r}")
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
    extra_headers: dict[str, str] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: must be an http(s) URL, got {self.base_url!r}")
        for key, tokens in (
            ("default_max_tokens", self.default_max_tokens),
            ("escalated_max_tokens", self.escalated_max_tokens),
        ):
            if tokens is not None and tokens < 1:
                raise ValueError(f"{key}: must be >= 1 or unset, got {tokens!r}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{key}={value!r}" for key, value in self.__rich_repr__())
        return f"EndpointSettings({fields})"

    __str__ = __repr__

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [
            ("base_url", self.base_url),
            ("api_key", "***" if self.api_key else ""),
            ("max_attempts", self.max_attempts),
            ("call_deadline_seconds", self.call_deadline_seconds),
            ("stream", self.stream),
            ("extra_headers", dict.fromkeys(self.extra_headers, "***")),
        ]


def endpoint_settings(
    limits: EndpointLimits, *, base_url: str, api_key: str = ""
) -> EndpointSettings:
    """The endpoint at ``base_url`` with the limits of ``limits`` (e.g. the config's
    ``[model]``, which extends :class:`EndpointLimits`): every limit is carried over.

    :raises ValueError: ``base_url`` is not an http(s) URL, or a limit is out of range.
    """
    values = {name: getattr(limits, name) for name in EndpointLimits.__struct_fields__}
    return EndpointSettings(base_url=base_url, api_key=api_key, **values)
