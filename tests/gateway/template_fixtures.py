"""Real tokenizers and chat templates, offline: Hugging Face tokenizer directories built from
the vocab-only GGUF files and the chat templates that llama.cpp ships in its sources.

The ``llama-cpp-python`` sdist on PyPI carries ``vendor/llama.cpp/models/``: vocab-only GGUF
files (``ggml-vocab-qwen2.gguf``, ``ggml-vocab-llama-bpe.gguf``, ...) with tokenisation test
vectors beside them (``.inp``/``.out``) and about seventy real chat templates
(``templates/*.jinja``). :func:`build_tokenizer_dir` rebuilds a byte-level BPE from a GGUF's
tokens and merges with the ``tokenizers`` library, puts each model's published added tokens
at their ids (the qwen2 vocab predates Qwen3: its ids from 151646 up are placeholders), checks
the result against the test vectors, and writes ``tokenizer.json`` plus a
``tokenizer_config.json`` carrying the chat template: a directory ``AutoTokenizer`` loads.

Test fixtures for the tests and ``benchmarks/templates.py``, built at test time and cached
(``$AGENTCORE_RL_FIXTURES`` or ``~/.cache/agentcore-rl/templates``), never committed. Needs
``tokenizers``, ``gguf`` and ``transformers`` (the ``dev`` extra) and, once, pip to download
the sdist (about 75 MB; only the vocab and template files are kept).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["FIXTURES", "SDIST", "Fixture", "build_tokenizer_dir", "default_cache", "fixture_dir"]

#: The PyPI sdist whose llama.cpp sources carry the vocab files and templates.
SDIST: Final = "llama-cpp-python==0.3.36"
_MODELS: Final = "vendor/llama.cpp/models/"

# Pre-tokenisation regexes of the two BPE families used here (as their tokenizer.json say).
_QWEN2_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's and Qwen3's added tokens at their published ids (tokenizer_config.json's
# added_tokens_decoder): (content, special).
_QWEN_ADDED: Final = {
    151643: ("<|endoftext|>", True),
    151644: ("<|im_start|>", True),
    151645: ("<|im_end|>", True),
    151646: ("<|object_ref_start|>", True),
    151647: ("<|object_ref_end|>", True),
    151648: ("<|box_start|>", True),
    151649: ("<|box_end|>", True),
    151650: ("<|quad_start|>", True),
    151651: ("<|quad_end|>", True),
    151652: ("<|vision_start|>", True),
    151653: ("<|vision_end|>", True),
    151654: ("<|vision_pad|>", True),
    151655: ("<|image_pad|>", True),
    151656: ("<|video_pad|>", True),
    151657: ("<tool_call>", False),
    151658: ("</tool_call>", False),
    151659: ("<|fim_prefix|>", False),
    151660: ("<|fim_middle|>", False),
    151661: ("<|fim_suffix|>", False),
    151662: ("<|fim_pad|>", False),
    151663: ("<|repo_name|>", False),
    151664: ("<|file_sep|>", False),
}
_QWEN3_ADDED: Final = {
    **_QWEN_ADDED,
    151665: ("<tool_response>", False),
    151666: ("</tool_response>", False),
    151667: ("<think>", False),
    151668: ("</think>", False),
}
# DeepSeek-R1-Distill-Qwen: the Qwen2.5 vocab with DeepSeek's own markers in front.
_R1_DISTILL_ADDED: Final = {
    **_QWEN_ADDED,
    151643: ("<｜end▁of▁sentence｜>", True),
    151644: ("<｜User｜>", False),
    151645: ("<｜Assistant｜>", False),
    151646: ("<｜begin▁of▁sentence｜>", True),
    151647: ("<|EOT|>", False),
    151648: ("<think>", False),
    151649: ("</think>", False),
}
# gpt-oss's harmony markers. Its o200k vocabulary is not shipped offline: the fixture puts
# them on Llama 3's reserved special ids (the template and the syntax are real, the ids are
# not gpt-oss's).
_HARMONY_ON_LLAMA3: Final = {
    128011: ("<|start|>", True),
    128012: ("<|end|>", True),
    128013: ("<|message|>", True),
    128014: ("<|channel|>", True),
    128015: ("<|constrain|>", True),
    128016: ("<|return|>", True),
    128017: ("<|call|>", True),
}
# Tekken's special tokens (mistral-common's ranks 0-19) and the tool-call markers Mistral
# Small 3.x's tokenizer adds at 32 and 33.
_TEKKEN_SPECIALS: Final = {
    i: (t, True)
    for i, t in enumerate(
        [
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
            "[IMG]",
            "<pad>",
            "[IMG_BREAK]",
            "[IMG_END]",
            "[PREFIX]",
            "[MIDDLE]",
            "[SUFFIX]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[TOOL_CONTENT]",
        ]
    )
} | {32: ("[ARGS]", True), 33: ("[CALL_ID]", True)}
_TEKKEN_SPLIT: Final = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: mistral-common's wheel carries Tekken vocabularies (``mistral_common/data/tekken_*.json``).
MISTRAL_COMMON: Final = "mistral-common==1.13.1"
_TEKKEN_FILE: Final = "mistral_common/data/tekken_240911.json"

# Llama 3.1 renamed some of Llama 3's reserved special tokens.
_LLAMA31_RENAMED: Final = {
    128004: ("<|finetune_right_pad_id|>", True),
    128005: ("<|reserved_special_token_2|>", True),
    128008: ("<|eom_id|>", True),
    128010: ("<|python_tag|>", True),
}


@dataclass(frozen=True, kw_only=True)
class Fixture:
    """One real model's tokenizer: a llama.cpp vocab, its template, its added tokens."""

    name: str
    vocab: str  # ggml-vocab-<vocab>.gguf, or "tekken" (mistral-common's Tekken file)
    template: str  # templates/<template>.jinja
    split: str
    nfc: bool = False
    ignore_merges: bool = False  # Llama 3: a word that is a token is not merged up to it
    added: Mapping[int, tuple[str, bool]] = field(default_factory=dict)
    bos: str | None = None
    eos: str = ""
    tool_parser: str = ""
    reasoning_parser: str | None = None
    thinking: bool = False  # the template drops earlier turns' reasoning when it re-renders


#: The templates the tests and ``benchmarks/templates.py`` run on.
FIXTURES: Final = {
    f.name: f
    for f in (
        Fixture(
            name="qwen3",
            vocab="qwen2",
            template="Qwen-Qwen3-0.6B",
            split=_QWEN2_SPLIT,
            nfc=True,
            added=_QWEN3_ADDED,
            eos="<|im_end|>",
            tool_parser="hermes",
            reasoning_parser="qwen3",
            thinking=True,
        ),
        Fixture(
            name="qwen2.5",
            vocab="qwen2",
            template="Qwen-Qwen2.5-7B-Instruct",
            split=_QWEN2_SPLIT,
            nfc=True,
            added=_QWEN_ADDED,
            eos="<|im_end|>",
            tool_parser="hermes",
        ),
        Fixture(
            name="llama3.1",
            vocab="llama-bpe",
            template="meta-llama-Llama-3.1-8B-Instruct",
            split=_LLAMA3_SPLIT,
            ignore_merges=True,
            added=_LLAMA31_RENAMED,
            bos="<|begin_of_text|>",
            eos="<|eot_id|>",
            tool_parser="llama3_json",
        ),
        Fixture(
            name="deepseek-r1-distill",
            vocab="qwen2",
            template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            split=_QWEN2_SPLIT,
            nfc=True,
            added=_R1_DISTILL_ADDED,
            bos="<｜begin▁of▁sentence｜>",
            eos="<｜end▁of▁sentence｜>",
            tool_parser="deepseek_v3",
            reasoning_parser="deepseek_r1",
            thinking=True,
        ),
        Fixture(
            name="gpt-oss",
            vocab="llama-bpe",
            template="openai-gpt-oss-120b",
            split=_LLAMA3_SPLIT,
            ignore_merges=True,
            added={**_LLAMA31_RENAMED, **_HARMONY_ON_LLAMA3},
            eos="<|return|>",
            tool_parser="openai",
            reasoning_parser="openai_gptoss",
            thinking=True,
        ),
        Fixture(
            name="mistral-small-3.2",
            vocab="tekken",
            template="Mistral-Small-3.2-24B-Instruct-2506",
            split=_TEKKEN_SPLIT,
            added=_TEKKEN_SPECIALS,
            bos="<s>",
            eos="</s>",
            tool_parser="mistral",
        ),
    )
}


def default_cache() -> Path:
    """``$AGENTCORE_RL_FIXTURES`` or ``~/.cache/agentcore-rl/templates``."""
    found = os.environ.get("AGENTCORE_RL_FIXTURES")
    if found:
        return Path(found)
    return Path.home() / ".cache" / "agentcore-rl" / "templates"


def _models_dir(cache: Path) -> Path:
    """The sdist's vocab and template files under ``cache`` (downloaded once with pip)."""
    models = cache / "llama.cpp-models"
    if (models / "templates").is_dir():
        return models
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--no-binary", ":all:", SDIST, "-d", tmp),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (archive,) = Path(tmp).glob("*.tar.gz")
        staged = Path(tmp) / "models"
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                _, _, inner = member.name.partition("/")
                if not inner.startswith(_MODELS) or not member.isfile():
                    continue
                rest = inner[len(_MODELS) :]
                if not (rest.startswith("ggml-vocab-") or rest.startswith("templates/")):
                    continue
                target = staged / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                target.write_bytes(source.read())
        _publish(staged, models)
    return models


def _publish(staged: Path, final: Path) -> None:
    """Move a finished build into place; another process that got there first wins."""
    try:
        os.replace(staged, final)  # readers never see half a directory
    except OSError:
        if not final.is_dir():
            raise


def _tekken_file(cache: Path) -> Path:
    """mistral-common's Tekken vocabulary under ``cache`` (its wheel downloaded once)."""
    target = cache / "tekken_240911.json"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"),
                *("--only-binary", ":all:", MISTRAL_COMMON, "-d", tmp),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            staged = Path(tmp) / "tekken.json"
            staged.write_bytes(archive.read(_TEKKEN_FILE))
        os.replace(staged, target)
    return target


def _read_tekken(path: Path) -> tuple[list[str], list[int], list[str]]:
    """A Tekken (tiktoken-style) vocabulary as byte-level BPE tokens and merges: ids are
    ``rank + 1000`` (its special tokens come first), merges recovered from the ranks."""
    data = json.loads(path.read_text(encoding="utf-8"))
    config = data["config"]
    specials = int(config["default_num_special_tokens"])
    size = int(config["default_vocab_size"]) - specials
    pieces = [base64.b64decode(t["token_bytes"]) for t in data["vocab"][:size]]
    byte_map = _bytes_to_unicode()
    strings = ["".join(byte_map[b] for b in piece) for piece in pieces]
    rank = {piece: i for i, piece in enumerate(pieces)}
    merges: list[tuple[int, int, int, str]] = []
    for i, piece in enumerate(pieces):
        if len(piece) < 2:
            continue
        local = []
        for cut in range(1, len(piece)):
            left, right = rank.get(piece[:cut]), rank.get(piece[cut:])
            if left is not None and right is not None:
                local.append((left, right))
        for left, right in sorted(local):
            merges.append((i, left, right, f"{strings[left]} {strings[right]}"))
    tokens = [f"<SPECIAL_{i}>" for i in range(specials)] + strings
    types = [4] * specials + [1] * len(strings)
    return tokens, types, [m[3] for m in merges]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-to-character table (what byte-level BPE vocabularies are written in)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _read_gguf(path: Path) -> tuple[list[str], list[int], list[str]]:
    # lazy: gguf is the render extra, used by these fixtures only
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = reader.fields
    tokens = [str(t) for t in fields["tokenizer.ggml.tokens"].contents()]
    types = [int(t) for t in fields["tokenizer.ggml.token_type"].contents()]
    merges = [str(m) for m in fields["tokenizer.ggml.merges"].contents()]
    return tokens, types, merges


def build_tokenizer_dir(
    gguf: Path | tuple[list[str], list[int], list[str]],
    template: str,
    out: Path,
    *,
    split: str,
    nfc: bool = False,
    ignore_merges: bool = False,
    added: Mapping[int, tuple[str, bool]] | None = None,
    bos: str | None = None,
    eos: str = "",
    vectors: Path | None = None,
) -> Path:
    """Write a Hugging Face tokenizer directory for a GGUF's byte-level BPE vocab (or for
    ``(tokens, token types, merges)`` already read).

    ``added`` puts tokens at given ids (content, special); the GGUF's control tokens
    (type 3) become special added tokens too. ``vectors``: the ``.inp`` file whose ``.out``
    beside it lists the expected ids; a mismatch raises ``ValueError``.
    """
    # lazy: tokenizers is the render extra
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    tokens, types, merges = _read_gguf(gguf) if isinstance(gguf, Path) else gguf
    chosen = dict(added or {})
    specials: dict[int, tuple[str, bool]] = {
        i: (tokens[i], True) for i, kind in enumerate(types) if kind == 3
    }
    specials.update(chosen)
    for i, (content, _) in specials.items():
        tokens[i] = content
    vocab = {token: i for i, token in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)  # type: ignore[arg-type]
    tokenizer = Tokenizer(bpe)
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(
        [
            AddedToken(content, special=special, normalized=False)
            for _, (content, special) in sorted(specials.items())
        ]
    )
    for i, (content, _) in specials.items():
        if tokenizer.token_to_id(content) != i:
            raise ValueError(f"added token {content!r} did not land at id {i}")
    if vectors is not None:
        _check_vectors(tokenizer, vectors)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "bos_token": bos,
        "eos_token": eos or None,
        "pad_token": eos or None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 131072,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return out


def _check_vectors(tokenizer: Any, inp: Path) -> None:
    """llama.cpp's tokeniser test vectors: inputs split by a marker line, one id line each."""
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    expected = Path(str(inp)[: -len(".inp")] + ".out").read_text(encoding="utf-8").split("\n")
    bad = []
    for text, ids in zip(texts, expected, strict=False):
        want = [int(x) for x in ids.split()]
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != want:
            bad.append(text)
    if bad:
        raise ValueError(f"{len(bad)} of {len(texts)} test vectors differ, e.g. {bad[0]!r}")


def fixture_dir(name: str, *, cache: Path | None = None) -> Path:
    """The tokenizer directory of fixture ``name`` (see :data:`FIXTURES`), built once."""
    fixture = FIXTURES.get(name)
    if fixture is None:
        raise ValueError(f"unknown fixture {name!r}; choose one of {sorted(FIXTURES)}")
    cache = cache or default_cache()
    out = cache / name
    if (out / "tokenizer_config.json").is_file():
        return out
    models = _models_dir(cache)
    template = (models / "templates" / f"{fixture.template}.jinja").read_text(encoding="utf-8")
    gguf: Path | tuple[list[str], list[int], list[str]]
    if fixture.vocab == "tekken":
        gguf, inp = _read_tekken(_tekken_file(cache)), None
    else:
        gguf = models / f"ggml-vocab-{fixture.vocab}.gguf"
        inp = Path(str(gguf) + ".inp")
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        staged = build_tokenizer_dir(
            gguf,
            template,
            Path(tmp) / name,
            split=fixture.split,
            nfc=fixture.nfc,
            ignore_merges=fixture.ignore_merges,
            added=fixture.added,
            bos=fixture.bos,
            eos=fixture.eos,
            vectors=inp if inp is not None and inp.is_file() else None,
        )
        _publish(staged, out)
    return out
