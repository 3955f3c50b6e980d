"""Adapters that plug rollouts into trainers, each imported only when used, with its extra:
``integrations.verl`` (``AgentCoreAgentLoop``), ``integrations.slime`` (``generate_rollout``,
``reward_post_process``) and ``integrations.skyrl`` (``AgentCoreGenerator``); all three share
:class:`AgentCoreSettings` and run every rollout through ``AsyncRolloutClient``
(docs/trainers.md).

Example::

    settings = AgentCoreSettings(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                 exp_id="grpo-1", gateway_url="http://127.0.0.1:9000")
"""

from agentcore_rl.integrations.settings import AgentCoreSettings

__all__ = ["AgentCoreSettings"]
