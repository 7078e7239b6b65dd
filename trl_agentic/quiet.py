"""Silence the lines a user of trl-agentic cannot act on; everything else is left as it is.

Installed when ``trl_agentic`` is imported, before TRL, transformers or bitsandbytes are (importing any of our
modules imports this package first). Each filter matches one message of one library:

- bitsandbytes' CPU backend logs "Failed to load CPU gemm_4bit_forward from kernels-community ..." on every import on
  a CPU with AVX512-BF16 when the optional ``kernels`` package is absent; it then uses its own kernel, and nothing
  runs differently for us (4-bit QLoRA on a CPU is tested without ``kernels``).
- transformers 5 deprecates ``gradient_checkpointing`` (the ``TrainingArguments`` field,
  ``gradient_checkpointing_enable`` / ``_disable``, ``is_gradient_checkpointing``) for ``activation_checkpointing``:
  TRL calls the old names around every generation, and TRL's and our configs take the field by its old name, so
  each training printed three FutureWarnings that no change of the user's script removes.

The datasets "couldn't be hashed" warning of the recipes is not silenced: :meth:`trl_agentic.tasks.base.Task.rows`
no longer asks datasets to hash its transform.
"""

from __future__ import annotations

import logging
import warnings

_BITSANDBYTES_CPU = "bitsandbytes.backends.cpu.ops"
_GEMM_KERNEL = "Failed to load CPU gemm_4bit_forward from kernels-community"
_CHECKPOINTING = r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated"


class _DropMessage(logging.Filter):
    """Drops the records of one logger whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def silence_unactionable() -> None:
    """Install the filters of the module docstring (idempotent)."""
    bitsandbytes = logging.getLogger(_BITSANDBYTES_CPU)
    if not any(isinstance(f, _DropMessage) for f in bitsandbytes.filters):
        bitsandbytes.addFilter(_DropMessage(_GEMM_KERNEL))
    warnings.filterwarnings("ignore", message=_CHECKPOINTING, category=FutureWarning, module=r"transformers\.")
