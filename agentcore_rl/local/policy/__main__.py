"""``python -m agentcore_rl.local.policy [--tokenizer DIR ...]``: serve the stand-in alone.

Example::

    python -m agentcore_rl.local.policy --port 8000 --tokenizer /tmp/qwen3 \\
        --tool-call-parser hermes --reasoning-parser qwen3 --tool-rounds 3
"""

from __future__ import annotations

import argparse
import sys

import uvicorn

from agentcore_rl.local.policy import ScriptedPolicy, ScriptVoice, TemplateVoice, Voice


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m agentcore_rl.local.policy",
        description="The scripted stand-in policy (not a language model) as an OpenAI server; "
        "with --tokenizer it renders that real chat template and also answers token-in "
        "(/v1/completions with token ids, /generate).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--accuracy", type=float, default=0.8)
    parser.add_argument("--tokenizer", metavar="DIR", help="a Hugging Face tokenizer directory")
    parser.add_argument("--tool-call-parser", help="the syntax of its tool calls (vLLM's names)")
    parser.add_argument("--reasoning-parser", help="the syntax of its reasoning (vLLM's names)")
    parser.add_argument("--tool-rounds", type=int, default=1, help="tool calls before answering")
    args = parser.parse_args()
    try:
        voice: Voice = (
            ScriptVoice(accuracy=args.accuracy)
            if args.tokenizer is None
            else TemplateVoice(
                args.tokenizer,
                tool_call_parser=args.tool_call_parser,
                reasoning_parser=args.reasoning_parser,
                tool_rounds=args.tool_rounds,
            )
        )
    except (ValueError, ImportError, OSError) as exc:
        parser.error(str(exc))
    print(
        f"scripted stand-in policy (not a language model) on http://{args.host}:{args.port}/v1",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(ScriptedPolicy(voice), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
