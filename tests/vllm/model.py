"""A tiny random-weight Qwen3 around the real Qwen3 tokenizer, built at test time and cached.

Two layers, hidden size 64 (about 20M parameters, nearly all of them the embedding and the
output layer of the 151,936-token vocabulary), saved with ``save_pretrained`` next to the
offline Qwen3 tokenizer of ``tests/gateway/template_fixtures.py``: a directory vLLM serves.

A random model picks ``<|im_end|>`` about once in 152k tokens, so every answer would run to
``max_tokens``. Residual dimension 0 is held at a constant (every token embeds it, no layer
writes to it), so after the final norm it is a near-constant feature; the output row of
``<|im_end|>`` reads it, which raises that token's logit on every step and ends answers in a
few dozen tokens. ``seed`` makes another model (the weights a test swaps in), which ends more
of its steps there.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Final

from tests.gateway.template_fixtures import default_cache, fixture_dir

__all__ = ["IM_END", "model_dir"]

IM_END: Final = 151645
_VOCAB: Final = 151936
_CONSTANT: Final = 40.0  # the held residual dimension's value
# The <|im_end|> row's weight on it: 1.25 ends about 13% of steps; each seed after the first
# ends more, so two models' logprobs are told apart at a glance.
_END_GAIN: Final = 1.25
_GAIN_PER_SEED: Final = 0.5


def model_dir(seed: int = 0, *, cache: Path | None = None) -> Path:
    """The model directory for ``seed`` (built once; about 40 MB in bf16)."""
    cache = cache or default_cache()
    out = cache / f"tiny-qwen3-{seed}"
    if (out / "config.json").is_file():
        return out
    tokenizer = fixture_dir("qwen3", cache=cache)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        staged = Path(tmp) / "model"
        _build(staged, seed)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (staged / name).write_bytes((tokenizer / name).read_bytes())
        config = json.loads((staged / "config.json").read_text())
        config["eos_token_id"] = IM_END
        (staged / "config.json").write_text(json.dumps(config, indent=1))
        try:
            os.replace(staged, out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    return out


def _build(directory: Path, seed: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # a head size the CPU attention kernels have
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=IM_END,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = _CONSTANT
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[IM_END, :] = 0.0
        model.lm_head.weight[IM_END, 0] = _END_GAIN + _GAIN_PER_SEED * seed
    model.to(torch.bfloat16).save_pretrained(directory)
