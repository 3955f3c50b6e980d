"""``python -m agentcore_rl.cli``: the same as the ``agentcore-rl`` command."""

from agentcore_rl.cli.main import main

raise SystemExit(main())
