"""A byte-level BPE tokenizer trained in a second on a small corpus, with a ChatML chat template (or Qwen2.5's,
which calls tools)."""

from __future__ import annotations

import random
from typing import Iterable

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_CALL_TOKENS = ["<tool_call>", "</tool_call>"]  # added (not special) tokens of Qwen2.5's tokenizer
TAG_TOKENS = [
    f"<{slash}{tag}>"
    for tag in ("think", "search", "lookup", "code", "calc", "answer", "information", "interpreter", "result")
    for slash in ("", "/")
]


def _default_corpus(n: int = 400, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = "what is the value of key find answer look up number tool result error question please use".split()
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        lines.append(f"{' '.join(rng.choices(words, k=6))} {a} + {b} = {a + b}. key k{a} is {b}!")
    return lines


def build_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 400, tool_calling: bool = False):
    """Train a byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``.

    Tags such as ``<search>`` and ``</answer>`` are single added tokens; ``<|im_end|>`` is EOS and
    ``<|endoftext|>`` the pad token, as in Qwen's instruct models. The chat template is plain ChatML
    (:data:`CHATML_TEMPLATE`, no tools), or with ``tool_calling`` Qwen2.5-Instruct's own, which renders tool schemas,
    ``<tool_call>`` calls and ``tool`` results (TRL's ``supports_tool_calling`` accepts it and its
    ``add_response_schema`` parses the calls); ``<tool_call>`` and ``</tool_call>`` are then added tokens, as Qwen2.5
    ships them.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus) if corpus is not None else _default_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.add_tokens(TAG_TOKENS)
    tokenizer.chat_template = CHATML_TEMPLATE
    if tool_calling:
        from ..compat import qwen2_5_chat_template

        tokenizer.add_tokens(TOOL_CALL_TOKENS)
        tokenizer.chat_template = qwen2_5_chat_template()
    return tokenizer
