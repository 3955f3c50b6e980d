"""``python -m agentcore_rl.gateway ...`` = ``agentcore-rl gateway ...`` (docs/gateway.md)."""

import sys

from agentcore_rl.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["gateway", *sys.argv[1:]]))
