"""Seconds to build each tiny real-model convention fixture (tests/conventions.py) in a fresh process.

    python benchmarks/convention_build.py

Reports the import time of torch + transformers (paid once per process) and then, per convention, the time of
``build_convention``: train the BPE, build the random model, save model + tokenizer + generation config, reload the
tokenizer with ``AutoTokenizer``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main() -> None:
    start = time.perf_counter()
    import transformers  # noqa: F401
    from transformers import Gemma3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM  # noqa: F401

    print(f"imports: {time.perf_counter() - start:.2f} s")
    from conventions import CONVENTIONS, build_convention

    for name in CONVENTIONS:
        start = time.perf_counter()
        build_convention(name)
        print(f"{name}: {time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
