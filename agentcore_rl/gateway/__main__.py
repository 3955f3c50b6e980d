"""``python -m agentcore_rl.gateway ...`` = ``agentcore-rl gateway ...`` (one implementation:
:func:`agentcore_rl.cli.commands.cmd_gateway`).

Example::

    python -m agentcore_rl.gateway --upstream http://127.0.0.1:8000/v1 --port 9000 \\
        --admin-token s3cret --sink-dir /var/lib/gateway/expired
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from agentcore_rl.cli import main

__all__ = ["serve"]


def serve(argv: Sequence[str] | None = None) -> int:
    """Run ``agentcore-rl gateway`` with ``argv``; -> its exit code."""
    return main(["gateway", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(serve())
