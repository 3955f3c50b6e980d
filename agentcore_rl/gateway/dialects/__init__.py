"""The agent-facing dialects, by route (docs/gateway.md, "Agent dialects"): OpenAI chat and
text completions (:mod:`.chat`), OpenAI Responses (:mod:`.responses`), Anthropic Messages
(:mod:`.messages`), Bedrock Converse (:mod:`.converse`); what a codec is: :mod:`.codec`."""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote

from agentcore_rl.gateway.dialects.chat import CHAT_DIALECT, COMPLETIONS_DIALECT
from agentcore_rl.gateway.dialects.codec import Dialect, Route
from agentcore_rl.gateway.dialects.converse import CONVERSE_DIALECT
from agentcore_rl.gateway.dialects.messages import MESSAGES_DIALECT
from agentcore_rl.gateway.dialects.responses import RESPONSES_DIALECT

__all__ = ["PATHS", "route_for"]

#: The routes after ``/sessions/{sid}/`` (and after the bearer form's root) by path.
PATHS: Final[dict[str, Route]] = {
    "v1/chat/completions": Route(CHAT_DIALECT),
    "v1/completions": Route(COMPLETIONS_DIALECT),
    "v1/messages": Route(MESSAGES_DIALECT),
    "v1/responses": Route(RESPONSES_DIALECT),
}
#: Bedrock Converse: ``model/{modelId}/converse`` and ``.../converse-stream``.
CONVERSE: Final[Dialect | None] = CONVERSE_DIALECT


def route_for(rest: str) -> Route | None:
    """The route for the path after ``/sessions/{sid}/`` (``v1/chat/completions``,
    ``model/{modelId}/converse``...), or None."""
    found = PATHS.get(rest)
    if found is not None:
        return found
    if rest.startswith("model/") and CONVERSE is not None:
        model, _, action = rest[len("model/") :].rpartition("/")
        if model and action in ("converse", "converse-stream"):
            return Route(CONVERSE, stream=action == "converse-stream", model=unquote(model))
    return None
