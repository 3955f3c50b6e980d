"""``python -m agentcore_rl.gateway ...`` = ``agentcore-rl gateway ...`` (one implementation:
:func:`agentcore_rl.cli.commands.cmd_gateway`).

Example::

    python -m agentcore_rl.gateway --upstream http://127.0.0.1:8000/v1 --port 9000 \\
        --admin-token s3cret --sink-dir /var/lib/gateway/expired
"""

import sys

from agentcore_rl.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["gateway", *sys.argv[1:]]))
