"""Fit rows to a trainer's prompt and response lengths, by one stated rule.

- A response longer than ``max_response_length`` is cut there. The kept tokens are exact
  (a causal model's logprob of a token depends only on what precedes it), so they still
  train; the cut tail does not.
- A prompt longer than ``max_prompt_length`` keeps its last ``max_prompt_length`` tokens
  (as veRL left-truncates prompts), and the row's whole loss mask becomes 0: the policy
  generated its response after a context the trainer no longer sees, so none of it may
  train. The row stays, so its reward still counts in its group.

Nothing is dropped: every row comes back, and :class:`FitReport` counts what was cut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from agentcore_rl.errors import ConfigurationError
from agentcore_rl.training.rows import TrainingRow

__all__ = ["FitReport", "fit_row", "fit_rows"]


@dataclass(frozen=True, kw_only=True)
class FitReport:
    """Fitted rows and what fitting changed.

    Example::

        report = fit_rows(rows, max_prompt_length=512, max_response_length=512)
        metrics["rows/prompts_masked"] = report.prompts_masked
    """

    rows: list[TrainingRow]
    responses_truncated: int = 0
    prompts_masked: int = 0
    response_tokens_cut: int = 0
    prompt_tokens_cut: int = 0


def _check(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")


def fit_row(row: TrainingRow, *, max_prompt_length: int, max_response_length: int) -> TrainingRow:
    """One row fitted by the module's rule (the same row when it already fits).

    Example::

        fit_row(row, max_prompt_length=512, max_response_length=512)
    """
    _check("max_prompt_length", max_prompt_length)
    _check("max_response_length", max_response_length)
    changes: dict[str, object] = {}
    if len(row.response_ids) > max_response_length:
        changes["response_ids"] = row.response_ids[:max_response_length]
        changes["loss_mask"] = row.loss_mask[:max_response_length]
        if row.logprobs is not None:
            changes["logprobs"] = row.logprobs[:max_response_length]
        changes["response_versions"] = row.response_versions[:max_response_length]
    if len(row.prompt_ids) > max_prompt_length:
        changes["prompt_ids"] = row.prompt_ids[-max_prompt_length:]
        kept = changes.get("loss_mask", row.loss_mask)
        assert isinstance(kept, list)
        changes["loss_mask"] = [0] * len(kept)
    return dataclasses.replace(row, **changes) if changes else row  # type: ignore[arg-type]


def fit_rows(
    rows: Iterable[TrainingRow], *, max_prompt_length: int, max_response_length: int
) -> FitReport:
    """Every row fitted by the module's rule, with counts of what was cut or masked.

    Example::

        report = fit_rows(rows, max_prompt_length=1024, max_response_length=2048)
    """
    _check("max_prompt_length", max_prompt_length)
    _check("max_response_length", max_response_length)
    out: list[TrainingRow] = []
    truncated = masked = response_cut = prompt_cut = 0
    for row in rows:
        fitted = fit_row(
            row, max_prompt_length=max_prompt_length, max_response_length=max_response_length
        )
        if len(fitted.response_ids) < len(row.response_ids):
            truncated += 1
            response_cut += len(row.response_ids) - len(fitted.response_ids)
        if len(fitted.prompt_ids) < len(row.prompt_ids):
            masked += 1
            prompt_cut += len(row.prompt_ids) - len(fitted.prompt_ids)
        out.append(fitted)
    return FitReport(
        rows=out,
        responses_truncated=truncated,
        prompts_masked=masked,
        response_tokens_cut=response_cut,
        prompt_tokens_cut=prompt_cut,
    )
