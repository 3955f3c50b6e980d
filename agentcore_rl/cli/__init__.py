"""The ``agentcore-rl`` command line (docs/cli.md; its modules: docs/architecture.md).

Example::

    from agentcore_rl.cli import main

    exit_code = main(["demo", "--n", "20"])
"""

from agentcore_rl.cli.main import main
from agentcore_rl.cli.parser import build_parser

__all__ = ["build_parser", "main"]
