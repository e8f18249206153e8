"""``POST /v1/replay``: ``loopfuse replay`` over HTTP, for the operator only.

The body is ``{"runs": [RUN, ...], "presets": [NAME, ...]}``; a ``RUN`` is
``{"name": ..., "events": [EVENT, ...]}`` (a run's logged events, as ``GET
/v1/runs/{id}/events`` streams them) or ``{"name": ..., "messages": [...], "tools": [...]}``
(an OpenAI chat transcript). The answer is ``{"rows": [...], "totals": [...]}`` as
``loopfuse replay --json`` prints it; runs are replayed under the daemon's own config (a
run's ``config``, a run export's settings, is refused: 422).

Only a bearer token from ``daemon.operator_token_env``'s variable is accepted: none or a
wrong one is 401, an API token (``daemon.token_env``) 403, and with no operator token
configured the endpoint answers 403 to everyone. The body is bounded by
``daemon.max_body_bytes`` and holds at most :data:`MAX_REPLAY_RUNS` runs (both 413).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final, get_args

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from orchestrator.config import Config, LoopPreset
from orchestrator.daemon.auth import Authenticator
from orchestrator.daemon.errors import ApiError
from orchestrator.daemon.http import json_response, read_body
from orchestrator.replay.command import replay_rows
from orchestrator.replay.openai_chat import recording_from_chat
from orchestrator.replay.recording import Recording, RecordingError
from orchestrator.replay.report import totals
from orchestrator.replay.sources import recording_from_export

__all__ = ["MAX_REPLAY_RUNS", "REPLAY_PATH", "replay_handler"]

REPLAY_PATH: Final = "/v1/replay"
MAX_REPLAY_RUNS: Final = 50
"""Runs one request may replay (times its presets, at most four)."""

_PRESETS: Final = frozenset(get_args(LoopPreset))
_BODY: Final = msgspec.json.Decoder(dict[str, Any])


def replay_handler(config: Config) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler on the daemon's ``config``."""
    operators = Authenticator.from_environment(config.daemon.operator_token_env, metrics_auth=False)
    api = Authenticator.from_environment(config.daemon.token_env, metrics_auth=False)

    async def replay(request: Request) -> Response:
        authorization = request.headers.get("authorization")
        if not operators.enabled:
            raise ApiError(
                403, "forbidden", "replay needs an operator token (daemon.operator_token_env)"
            )
        if not operators.accepts(authorization):
            if api.enabled and api.accepts(authorization):
                raise ApiError(403, "forbidden", "replay needs an operator token, not an API token")
            raise ApiError(
                401,
                "unauthorized",
                "an operator's bearer token is required (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        body = await read_body(request, config.daemon.max_body_bytes)
        try:
            document = _BODY.decode(body)
        except msgspec.DecodeError as exc:
            raise ApiError(400, "bad_json", f"the body is not a JSON object: {exc}") from None
        runs, presets = document.get("runs"), document.get("presets", [])
        if not isinstance(runs, list) or not runs:
            raise ApiError(422, "invalid", "runs: a non-empty list is required", key="runs")
        if len(runs) > MAX_REPLAY_RUNS:
            raise ApiError(
                413, "too_many_runs", f"runs: at most {MAX_REPLAY_RUNS} a request", key="runs"
            )
        if (
            not isinstance(presets, list)
            or len(presets) > 4
            or not all(p in _PRESETS for p in presets)
        ):
            raise ApiError(
                422,
                "invalid",
                f"presets: at most 4 of {', '.join(sorted(_PRESETS))}",
                key="presets",
            )
        recordings = [_recording(index, run) for index, run in enumerate(runs)]
        rows = await replay_rows(config, recordings, presets)
        return json_response({"rows": rows, "totals": totals(rows)})

    return replay


def _recording(index: int, run: Any) -> Recording:
    key = f"runs[{index}]"
    if not isinstance(run, dict):
        raise ApiError(422, "invalid", f"{key}: an object is required", key=key)
    name = str(run.get("name") or key)
    if "events" in run:
        try:  # its errors name runs[i] (their key) already
            return recording_from_export(key, {**run, "name": name}, config=False)
        except RecordingError as exc:
            raise ApiError(422, "invalid", str(exc), key=key) from None
    try:
        return recording_from_chat(name, run)
    except (RecordingError, msgspec.ValidationError, ValueError) as exc:
        raise ApiError(422, "invalid", f"{key}: {exc}", key=key) from None
