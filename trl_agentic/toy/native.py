"""The lookup task as a TRL user writes it: an ``environment_factory`` class whose tool the model calls natively.

:class:`KeyValueStore` is TRL's kind of environment (``reset(**row)`` and a public tool method with a docstring, no
``step``): the model is shown ``find key k37`` with the ``lookup`` tool's schema in its system turn (Qwen2.5's chat
template), must call it with a JSON tool call (``<tool_call>{"name": "lookup", "arguments": {"key": "k37"}}
</tool_call>``), read the ``<tool_response>`` and answer with the value alone. The value is drawn at random for every
row, independently of the key, so no model can answer without the tool (:func:`~trl_agentic.toy.make_lookup_dataset`).

A random 2-layer model must learn the JSON format from scratch, where a real instruct model has it from its training.
So that it can in a few CPU minutes, :func:`build_tool_tokenizer` trains its byte-level BPE on conversations of this
task (rendered by the chat template) with merges across spaces and digits kept apart: the template's fixed text (the
tool schema, the call's JSON) becomes a few tokens, and copying a key or a value is copying digit tokens, as it is
for a real tokenizer. The rest is what a real run does: TRL's response template parses the calls, the class's method
answers them, rewards read the messages.
"""

from __future__ import annotations

from typing import Any

from .task import make_lookup_dataset
from .tokenizer import SPECIAL_TOKENS, TOOL_CALL_TOKENS, build_tokenizer


class KeyValueStore:
    """TRL's ``environment_factory`` class for the lookup task: ``lookup(key)`` returns the row's value for the
    row's key and ``not found`` for any other."""

    def reset(self, key: str, value: str, **row: Any) -> None:
        self.key, self.value = key, value

    def lookup(self, key: str) -> str:
        """Look up the value stored under a key.

        Args:
            key: The key to look up.
        """
        return self.value if key.strip() == self.key else "not found"


def key_value_demonstration(row: dict[str, Any]) -> dict[str, Any]:
    """The row with a tool-calling trace as its ``completion``: the ``lookup`` call, its result, the value."""
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": row["key"]}}}
    return {**row, "completion": [{"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "name": "lookup", "content": row["value"]},
                                  {"role": "assistant", "content": row["value"]}]}


def key_value_success(completions: list[Any], value: list[str], **kwargs: Any) -> list[float]:
    """The task's outcome, a TRL reward function: 1.0 when the conversation has a tool result and its last message is
    the row's value alone, else 0.0."""
    rewards = []
    for messages, expected in zip(completions, value):
        looked_up = any(m.get("role") == "tool" for m in messages)
        answer = (messages[-1].get("content") or "").strip() if messages[-1].get("role") == "assistant" else None
        rewards.append(float(looked_up and answer == str(expected)))
    return rewards


def build_tool_tokenizer(vocab_size: int = 800, conversations: int = 300, seed: int = 99) -> Any:
    """A byte-level BPE tokenizer with Qwen2.5-Instruct's tool-calling chat template, trained on ``conversations``
    renderings of the lookup task (their keys and values drawn with ``seed``, apart from any dataset's), merging
    across spaces, digits split (module docstring). ``<|im_end|>`` is EOS, ``<|endoftext|>`` pad, ``<tool_call>`` and
    ``</tool_call>`` added tokens, as Qwen2.5 ships them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from ..compat import qwen2_5_chat_template

    def wrap(tokenizer: Any) -> Any:
        fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                       pad_token="<|endoftext|>", bos_token=None)
        fast.add_tokens(TOOL_CALL_TOKENS)
        fast.chat_template = qwen2_5_chat_template()
        return fast

    def bpe() -> Any:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                           pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                    use_regex=False)])
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer

    renderer = build_tokenizer(tool_calling=True)  # the template's text does not depend on the vocabulary
    rows = make_lookup_dataset(conversations, seed=seed, conversational=True)
    corpus = [renderer.apply_chat_template(row["prompt"] + key_value_demonstration(row)["completion"],
                                           tools=[KeyValueStore.lookup], tokenize=False) for row in rows]
    tokenizer = bpe()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + TOOL_CALL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                                  max_token_length=64)
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return wrap(tokenizer)
