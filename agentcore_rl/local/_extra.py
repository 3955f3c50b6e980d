"""What ``agentcore_rl.local`` needs from its extra, checked before the rest imports it."""

from agentcore_rl._extras import require

# What importing needs; the embedded S3 names the extra again for moto when it starts.
require("local", "agentcore_rl.local", "starlette", "uvicorn", "httpx")
