"""``gen_ai.provider.name`` of a model endpoint: who serves the model, as the GenAI semantic
conventions name it (``openai``, ``deepseek``, ``azure.ai.openai`` …), derived from the
endpoint's host unless the operator names it (``[tracing] provider_name``).

Imports nothing of OpenTelemetry (the runtime calls it before tracing is set up).
"""

from __future__ import annotations

import urllib.parse
from typing import Final

__all__ = ["MODEL_ACTOR_PROVIDER", "OPENAI_COMPATIBLE", "SIMULATOR", "provider_of"]

SIMULATOR: Final = "loopfuse.simulator"
"""The embedded simulator (no ``model.base_url``): a scripted model, not a provider."""
MODEL_ACTOR_PROVIDER: Final = "loopfuse.model_actor"
"""A runtime whose model is an actor of the caller's (``Runtime(model_actor=...)``)."""
OPENAI_COMPATIBLE: Final = "openai_compatible"
"""A host the table does not know (a local or self-hosted server speaking OpenAI's API)."""

_HOSTS: Final = {
    "api.openai.com": "openai",
    "api.deepseek.com": "deepseek",
    "api.groq.com": "groq",
    "api.mistral.ai": "mistral_ai",
    "api.x.ai": "x_ai",
    "api.perplexity.ai": "perplexity",
    "api.anthropic.com": "anthropic",
    "api.cohere.ai": "cohere",
    "api.cohere.com": "cohere",
    "generativelanguage.googleapis.com": "gcp.gemini",
}
"""Well-known hosts → the conventions' well-known provider names."""
_SUFFIXES: Final = {
    ".openai.azure.com": "azure.ai.openai",
    ".services.ai.azure.com": "azure.ai.inference",
    ".aiplatform.googleapis.com": "gcp.vertex_ai",
}


def provider_of(base_url: str | None) -> str:
    """The provider serving ``base_url`` (``None``: :data:`SIMULATOR`)."""
    if base_url is None:
        return SIMULATOR
    try:
        host = (urllib.parse.urlsplit(base_url).hostname or "").lower()
    except ValueError:
        return OPENAI_COMPATIBLE
    suffixed = (name for suffix, name in _SUFFIXES.items() if host.endswith(suffix))
    return _HOSTS.get(host) or next(suffixed, OPENAI_COMPATIBLE)
