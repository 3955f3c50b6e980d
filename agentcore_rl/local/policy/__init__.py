"""The stand-in policy: :class:`ScriptedPolicy`, an OpenAI-compatible server in place of
vLLM/SGLang that says what its :class:`Voice` says; not a language model.
``python -m agentcore_rl.local.policy`` serves it alone."""

from agentcore_rl.local.policy.scripted_policy import DEFAULT_POLICY_MODEL, ScriptedPolicy, Serving
from agentcore_rl.local.policy.voices import (
    PlayFunction,
    PlayVoice,
    Said,
    ScriptVoice,
    TemplateVoice,
    Voice,
    fake_token_ids,
)
from agentcore_rl.local.policy.word_problems import evaluate_arithmetic, solve_word_problem

__all__ = [
    "DEFAULT_POLICY_MODEL",
    "PlayFunction",
    "PlayVoice",
    "Said",
    "ScriptVoice",
    "ScriptedPolicy",
    "Serving",
    "TemplateVoice",
    "Voice",
    "evaluate_arithmetic",
    "fake_token_ids",
    "solve_word_problem",
]
