"""Adapters that plug rollouts into trainers: veRL, slime and SkyRL.

Each adapter is a module imported only when used, each with its extra
(``pip install 'agentcore-rl[verl]'``, ``[slime]``, ``[skyrl]``):

- ``agentcore_rl.integrations.verl``: ``AgentCoreAgentLoop``, a veRL agent loop.
- ``agentcore_rl.integrations.slime``: ``generate_rollout`` (slime's custom rollout
  function) and ``reward_post_process`` (its group-aware reward hook).
- ``agentcore_rl.integrations.skyrl``: ``AgentCoreGenerator``, a SkyRL generator.

All three share :class:`AgentCoreSettings` (where the agent runs, S3, the gateway, limits,
the group rules that still apply) and run every rollout through ``AsyncRolloutClient``.

Example::

    settings = AgentCoreSettings(agent_url="http://127.0.0.1:8080", s3_bucket="rollouts",
                                 exp_id="grpo-1", gateway_url="http://127.0.0.1:9000")
"""

from agentcore_rl.integrations.settings import AgentCoreSettings

__all__ = ["AgentCoreSettings"]
