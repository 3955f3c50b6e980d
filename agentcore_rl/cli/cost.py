"""What a rollout cost: an ESTIMATE from what was measured, at prices you can set
(docs/cli.md says what is and is not counted)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from agentcore_rl import protocol
from agentcore_rl.errors import ConfigurationError

__all__ = ["Prices", "number", "price", "total", "trace_messages", "trace_tokens", "usage_of"]

_GB: Final = 1024**3
_TOKENS: Final = ("prompt_tokens", "completion_tokens")


@dataclass(frozen=True, kw_only=True)
class Prices:
    """USD prices; the compute defaults are AgentCore Runtime's, token prices unset."""

    vcpu_hour: float = 0.0895
    gb_hour: float = 0.00945
    input_mtok: float | None = None
    output_mtok: float | None = None

    @classmethod
    def parse(cls, pairs: Iterable[str]) -> Prices:
        """From ``NAME=USD`` strings (``--price output_mtok=1.5``)."""
        names = [f.name for f in fields(cls)]
        values: dict[str, float] = {}
        for pair in pairs:
            name, _, text = (part.strip() for part in pair.partition("="))
            if name not in names:
                raise ConfigurationError(f"--price {pair!r}: expected NAME=USD, NAME in {names}")
            with contextlib.suppress(ValueError):
                values[name] = float(text)
            if not 0 <= values.get(name, -1) < math.inf:
                raise ConfigurationError(f"--price {pair!r}: the price must be a number >= 0")
        return cls(**values)

    def describe(self) -> str:
        """One line: what is priced and at what."""
        tokens = "model tokens not priced"
        if self.input_mtok is not None or self.output_mtok is not None:
            tokens = f"tokens ${self.input_mtok or 0:g} / ${self.output_mtok or 0:g} per M in / out"
        return f"${self.vcpu_hour:g}/vCPU-h, ${self.gb_hour:g}/GB-h, {tokens}"


def number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool), else ``None``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def usage_of(record: Mapping[str, Any], tokens: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What one results line measured (envelope figures, gateway token counts)."""
    envelope = record.get("result")
    envelope = envelope if isinstance(envelope, Mapping) else {}
    runtime = number(envelope.get(protocol.RUNTIME_SECONDS))
    start = number(envelope.get(protocol.STARTED_AT))
    end = number(envelope.get(protocol.FINISHED_AT))
    if runtime is None and start is not None and end is not None and end >= start:
        runtime = end - start
    memory = number(envelope.get(protocol.PEAK_MEMORY_BYTES))
    tokens = tokens or {}
    return {
        "runtime_s": None if runtime is None else round(runtime, 3),
        "cpu_s": number(envelope.get(protocol.CPU_SECONDS)),
        "peak_memory_gb": None if memory is None else round(memory / _GB, 6),
        **{k: tokens.get(k) if number(tokens.get(k)) is not None else None for k in _TOKENS},
    }


def trace_tokens(trace: Any) -> dict[str, int]:
    """The billed tokens of a session's model calls (each turn resends the conversation)."""
    ok = [r for r in (trace.records if trace is not None else ()) if r.ok]
    if not ok:
        return {}
    completions = sum(len(c.token_ids) for r in ok for c in r.completions)
    return {"prompt_tokens": sum(len(r.prompt_ids) for r in ok), "completion_tokens": completions}


def trace_messages(trace: Any) -> list[Any] | None:
    """The conversation the model was last sent (a transcript when the agent returns none)."""
    ok = [r for r in (trace.records if trace is not None else ()) if r.ok]
    return ok[-1].messages if ok else None


def price(usage: Mapping[str, Any], prices: Prices) -> dict[str, Any]:
    """``usage`` plus its estimated USD per part and ``usd``; an unmeasured part is None."""
    cpu, runtime, memory = usage.get("cpu_s"), usage.get("runtime_s"), usage.get("peak_memory_gb")
    rates = (prices.input_mtok, prices.output_mtok)
    model = [
        usage[k] * rate / 1e6
        for k, rate in zip(_TOKENS, rates, strict=True)
        if usage.get(k) is not None and rate is not None
    ]
    parts = {
        "cpu_usd": None if cpu is None else cpu / 3600 * prices.vcpu_hour,
        "memory_usd": None,
        "model_usd": math.fsum(model) if model else None,
    }
    if memory is not None and runtime is not None:
        parts["memory_usd"] = memory * runtime / 3600 * prices.gb_hour
    known = [v for v in parts.values() if v is not None]
    return {**usage, **parts, "usd": math.fsum(known) if known else None}


def total(costs: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Sums over a run: ``usd`` and each measured part, and how many rollouts had a cost."""
    priced = [c for c in costs if c and c.get("usd") is not None]
    sums = {
        key: math.fsum(v) if (v := [c[key] for c in priced if c.get(key) is not None]) else None
        for key in ("usd", "cpu_usd", "memory_usd", "model_usd", "runtime_s", "cpu_s")
    }
    return {**sums, "rollouts": len(priced)}
