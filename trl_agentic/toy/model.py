"""A tiny randomly initialised Qwen2 causal LM for CPU tests and the demo."""

from __future__ import annotations

from typing import Any


def build_tiny_model(tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, seed: int = 0):
    """A 2-layer Qwen2 with random weights sized to ``tokenizer`` (about 100k parameters at hidden 64)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        do_sample=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    return model


def save_tiny_model(path: str, seed: int = 0) -> str:
    """Write a tiny random Qwen2 and its tokenizer to ``path`` and return ``path``: a model id for any
    ``from_pretrained``, made offline in a second (the README's and the docs' examples use it). The tokenizer is
    :func:`~trl_agentic.toy.build_tokenizer`'s with Qwen2.5-Instruct's chat template (``tool_calling=True``), so the
    model can be given tools, natively (TRL's ``tools=``, ``environment_factory=``, an agent's ``tools``) as with
    text tags."""
    from .tokenizer import build_tokenizer

    tokenizer = build_tokenizer(tool_calling=True)
    build_tiny_model(tokenizer, seed=seed).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
