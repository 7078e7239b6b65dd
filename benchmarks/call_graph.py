"""How many of the library's functions does one training step go through? (issue 53)

    python benchmarks/call_graph.py [--trainer grpo|ppo] [--max-staleness 0] [--json out.json]

Trains a tiny model (the toy lookup task, our environment) for two steps and records, during the second, every call
from a function of ``trl_agentic`` to another function of ``trl_agentic`` (``sys.setprofile``: Python calls only;
comprehensions, lambdas and generator bodies count as the functions they are in). Prints the distinct
caller -> callee pairs, the files they span, and the pairs themselves with ``--list``: a reader of one step follows
these. Run it on two commits, side by side, to compare them (the same task, settings and seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PACKAGE = f"{os.sep}trl_agentic{os.sep}"


def _name(code) -> str:
    path = code.co_filename.split(PACKAGE, 1)[1]
    return f"{path}:{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}"


def _own(code) -> bool:
    return PACKAGE in code.co_filename and code.co_name not in ("<listcomp>", "<dictcomp>", "<setcomp>",
                                                                 "<genexpr>", "<lambda>")


def _frame_owner(frame):
    """The innermost frame of ``frame``'s stack that is a named function of the library (comprehensions and lambdas
    are part of the function they are written in)."""
    while frame is not None and not _own(frame.f_code):
        if PACKAGE not in frame.f_code.co_filename:
            return None
        frame = frame.f_back
    return frame


def record_step(trainer_name: str, max_staleness: int) -> set[tuple[str, str]]:
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer
    from trl_agentic.toy import LookupEnvironment, build_tiny_model, build_tokenizer, lookup_reward, make_lookup_dataset

    pairs: set[tuple[str, str]] = set()

    def profile(frame, event, arg):
        if event != "call" or not _own(frame.f_code):
            return
        caller = _frame_owner(frame.f_back)
        if caller is not None:
            pairs.add((_name(caller.f_code), _name(frame.f_code)))

    class SecondStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 1:
                sys.setprofile(profile)

        def on_step_end(self, args, state, control, **kwargs):
            sys.setprofile(None)

    out = Path(tempfile.mkdtemp())
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer).save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    common = dict(output_dir=str(out / "run"), per_device_train_batch_size=4, max_completion_length=48,
                  max_tokens_per_turn=12, max_turns=3, max_steps=2, learning_rate=1e-3, logging_steps=1,
                  report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no", max_staleness=max_staleness)
    if trainer_name == "ppo":
        trainer_cls, args = AgenticPPOTrainer, AgenticPPOConfig(**common, num_generations=1, beta=0.05)
    else:
        trainer_cls, args = AgenticGRPOTrainer, AgenticGRPOConfig(**common, num_generations=2)
    trainer = trainer_cls(model=str(out / "model"), reward_funcs=lookup_reward, args=args,
                          train_dataset=Dataset.from_list(make_lookup_dataset(16)), processing_class=tokenizer,
                          environment=LookupEnvironment)
    trainer.add_callback(SecondStep())
    trainer.train()
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="print every caller -> callee pair")
    parser.add_argument("--json", type=Path, help="write the pairs and the counts here")
    args = parser.parse_args(argv)
    pairs = record_step(args.trainer, args.max_staleness)
    files = sorted({name.split(":", 1)[0] for pair in pairs for name in pair})
    print(f"{args.trainer}, max_staleness {args.max_staleness}: one step goes through {len(pairs)} caller -> callee "
          f"pairs of the library's functions, over {len(files)} files")
    if args.list:
        for caller, callee in sorted(pairs):
            print(f"  {caller} -> {callee}")
    if args.json:
        args.json.write_text(json.dumps({"pairs": sorted(pairs), "files": files}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
