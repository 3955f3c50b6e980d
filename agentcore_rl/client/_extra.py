"""What ``agentcore_rl.client`` needs from its extra, checked before the rest imports it."""

from agentcore_rl._extras import require

require("client", "agentcore_rl.client", "httpx")
