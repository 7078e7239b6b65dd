"""Offline building blocks: a tokenizer trained on the spot, a tiny random causal LM and a toy tool task.

Used by the CPU demo (``python -m trl_agentic.demo``) and the tests; nothing here touches the Hugging Face Hub.
"""

from .model import build_tiny_model, save_tiny_model
from .task import LOOKUP_TAGS, LookupEnvironment, lookup_reward, lookup_success, make_lookup_dataset
from .tokenizer import CHATML_TEMPLATE, build_tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "LOOKUP_TAGS",
    "LookupEnvironment",
    "build_tiny_model",
    "build_tokenizer",
    "lookup_reward",
    "lookup_success",
    "make_lookup_dataset",
    "save_tiny_model",
]
