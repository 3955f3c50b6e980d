"""The trainers' tests run only under `make test-trainers` (their own venv, with torch, veRL,
SkyRL and optionally slime's source); `make test`'s suite does not collect them.

SkyRL 0.4.0 declares Python >= 3.12 because pydantic needs ``typing_extensions.TypedDict``
on older Pythons for the TypedDicts it validates; pointing ``typing.TypedDict`` at it (the
same class on 3.12+) before SkyRL is imported is all that 3.10/3.11 need.
"""

from __future__ import annotations

import os
import typing

import typing_extensions

ENABLED = os.environ.get("AGENTCORE_RL_TRAINER_TESTS") == "1"

if not ENABLED:
    collect_ignore_glob = ["test_*.py", "helpers.py", "agent.py"]
else:
    vars(typing)["TypedDict"] = typing_extensions.TypedDict
