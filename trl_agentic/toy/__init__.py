"""Offline building blocks: a tokenizer trained on the spot, a tiny random causal LM and two toy tool tasks (text tags:
the lookup task; native tool calls: ``add``).

Used by the CPU demo (``python -m trl_agentic.demo``) and the tests; nothing here touches the Hugging Face Hub.
"""

from .addition import add, addition_reward, make_addition_dataset, save_addition_dataset
from .model import build_tiny_model, save_tiny_model
from .task import LOOKUP_TAGS, LookupEnvironment, lookup_reward, lookup_success, make_lookup_dataset
from .tokenizer import CHATML_TEMPLATE, build_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "LOOKUP_TAGS",
    "LookupEnvironment",
    "add",
    "addition_reward",
    "build_tiny_model",
    "build_tokenizer",
    "lookup_reward",
    "lookup_success",
    "make_addition_dataset",
    "make_lookup_dataset",
    "save_addition_dataset",
    "save_tiny_model",
]
