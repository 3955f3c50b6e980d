"""The ``agentcore-rl`` command line: one module per concern.

``main`` parses and dispatches, ``commands`` holds one function per subcommand,
``eval_config``/``eval``/``journal``/``summary`` are the evaluation run (inputs, worker
pool, resumable files, figures), ``demo`` is the whole stack on one machine, ``show`` and
``report`` read a finished run, ``common`` has the exit codes and the Ctrl-C-aware runner.

Example::

    from agentcore_rl.cli import main

    exit_code = main(["demo", "--n", "20"])
"""

from agentcore_rl.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
