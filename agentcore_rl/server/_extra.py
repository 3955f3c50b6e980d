"""What ``agentcore_rl.server`` needs from its extra, checked before the rest imports it."""

from agentcore_rl._extras import require

require("server", "agentcore_rl.server", "starlette", "uvicorn")
