"""Run one TRL scenario on TRL 1.16's ``GRPOTrainer`` and on ours with only the class (and config class) swapped.

The scenarios are those of TRL 1.16's documentation, example scripts and ``tests/test_grpo_trainer.py`` for
``tools=`` and ``environment_factory=``, re-written here (third-party code is not copied into this repository;
Apache-2.0 scenarios by the TRL authors). They run the way TRL's tests run them: the model and the reward model are
given as paths (TRL's tests pass hub ids), the dataset is a conversational prompt-only one (TRL's ``zen``), and
``model.generate`` is replaced by a double that returns ``cat(input_ids, completion_ids)`` as a plain tensor, the
completions chosen by the number of rows asked for (the whole batch: first turn; fewer: after tools).

Flavours: ``trl`` (``GRPOTrainer`` + ``GRPOConfig``), ``ours`` (``AgenticGRPOTrainer`` + ``GRPOConfig``), ``ours+config``
(``AgenticGRPOTrainer`` + ``AgenticGRPOConfig``) and ``ppo`` (``AgenticPPOTrainer`` + ``AgenticPPOConfig``, which has
no TRL twin).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch
from conventions import build_convention
from helpers import native_call as call  # noqa: F401 - the scenarios' calls

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

FLAVOURS = ("trl", "ours", "ours+config", "ppo")
GRPO_FLAVOURS = ("trl", "ours", "ours+config")

# Entries of TRL's log whose values depend on the wall clock, not on what was trained.
TIMING_KEYS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "step_time", "epoch"}


def classes(flavour: str) -> tuple[type, type]:
    """The trainer class and the config class of a flavour."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    return {
        "trl": (GRPOTrainer, GRPOConfig),
        "ours": (AgenticGRPOTrainer, GRPOConfig),
        "ours+config": (AgenticGRPOTrainer, AgenticGRPOConfig),
        "ppo": (AgenticPPOTrainer, AgenticPPOConfig),
    }[flavour]


@functools.cache
def policy(name: str = "qwen2.5-instruct") -> str:
    """The path of a tiny random policy of a real convention (TRL's tests use ``tiny-Qwen3MoeForCausalLM``)."""
    return build_convention(name).model_dir


@functools.cache
def reward_model(name: str = "qwen2.5-instruct") -> str:
    """The path of a tiny random sequence-classification reward model with the policy's tokenizer (TRL's tests use
    ``tiny-Qwen2ForSequenceClassification-2.5``)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    source = policy(name)
    config = AutoConfig.from_pretrained(source)
    config.num_labels = 1
    tokenizer = AutoTokenizer.from_pretrained(source)
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = AutoModelForSequenceClassification.from_config(config)
    path = Path(source).parent / f"{Path(source).name}-reward"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def zen(n: int = 12) -> Any:
    """A conversational prompt-only dataset, as TRL's ``zen`` (``conversational_prompt_only``)."""
    from datasets import Dataset

    lines = ["Beautiful is better than ugly.", "Explicit is better than implicit.", "Simple is better than complex.",
             "Complex is better than complicated.", "Flat is better than nested.", "Sparse is better than dense."]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": lines[i % len(lines)]}] for i in range(n)]})


Script = Callable[[int, int], Sequence[str]]
"""``script(call, rows)``: the texts of one ``generate`` call (its index among the calls, the number of rows asked)."""


def fake_generate(tokenizer: Any, script: Script, calls: list[int]) -> Callable[..., torch.Tensor]:
    """TRL's tests' double for ``model.generate``: ``cat(input_ids, completion_ids)``, rows padded to one length with
    the pad id after their end; ``calls`` records the number of rows of each call. Unlike TRL's doubles, and as
    ``generate`` itself, it returns at most ``max_new_tokens`` new ids (a longer row would be kept whole by TRL and
    cut by a budget check of ours: the difference would be the double's, not the trainers')."""

    def generate(input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        texts = list(script(len(calls), input_ids.shape[0]))
        calls.append(input_ids.shape[0])
        assert len(texts) == input_ids.shape[0], f"the script gave {len(texts)} texts for {input_ids.shape[0]} rows"
        config = kwargs.get("generation_config")
        budget = kwargs.get("max_new_tokens") or getattr(config, "max_new_tokens", None)
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:budget] for text in texts]
        width = max(len(row) for row in ids)
        rows = [row + [tokenizer.pad_token_id] * (width - len(row)) for row in ids]
        return torch.cat([input_ids, torch.tensor(rows, dtype=input_ids.dtype, device=input_ids.device)], dim=-1)

    return generate


def by_rows(first: Sequence[str], later: Sequence[str]) -> Script:
    """TRL's tests' script: the whole batch gets ``first``; a smaller call (the rollouts that called tools) gets
    ``later``'s first rows."""
    width = len(first)
    return lambda index, rows: list(first) if rows == width else list(later)[:rows]


def by_turn(*turns: Sequence[str]) -> Script:
    """A script by turn: call ``i`` gets ``turns[i % len(turns)]``'s first rows (each training step makes
    ``len(turns)`` calls, every rollout taking every turn)."""
    return lambda index, rows: list(turns[index % len(turns)])[:rows]


@dataclass
class Run:
    """What one flavour of a scenario did."""

    flavour: str
    trainer: Any
    calls: list[int] = field(default_factory=list)
    error: str | None = None
    params_changed: bool = False

    @property
    def logs(self) -> list[dict[str, float]]:
        return [dict(entry) for entry in self.trainer.state.log_history] if self.trainer is not None else []

    def last(self, key: str) -> float:
        """The last logged value of ``key`` (TRL's tests read ``log_history[-1]``)."""
        values = [entry[key] for entry in self.logs if key in entry]
        assert values, f"{self.flavour}: {key} was never logged"
        return values[-1]


def config_values(flavour: str, **values: Any) -> dict[str, Any]:
    """The config of a scenario for a flavour: TRL's test values, CPU settings, and for PPO what a critic needs."""
    base = dict(output_dir=values.pop("output_dir"), report_to="none", use_cpu=True, bf16=False, seed=0,
                logging_steps=1, save_strategy="no")
    base.update(values)
    if flavour == "ppo":
        base.setdefault("beta", 0.0)
    return base


def run(flavour: str, tmp_path: Path, script: Script, train: bool = True, model: str | None = None,
        config: dict[str, Any] | None = None, **kwargs: Any) -> Run:
    """Build the flavour's trainer from TRL's arguments (``model`` a path, ``args`` from ``config``) and train it
    under the ``generate`` double; an exception at construction or in training is kept as ``error``."""
    trainer_class, config_class = classes(flavour)
    args = config_class(**config_values(flavour, output_dir=str(tmp_path / flavour), **(config or {})))
    try:
        trainer = trainer_class(model=model or policy(), args=args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared across flavours
        return Run(flavour, None, error=f"{type(exc).__name__}: {exc}")
    result = Run(flavour, trainer)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    if train:
        with patch.object(trainer.model, "generate", side_effect=fake_generate(trainer.processing_class, script,
                                                                                 result.calls)):
            try:
                torch.manual_seed(0)
                trainer.train()
            except Exception as exc:  # noqa: BLE001
                result.error = f"{type(exc).__name__}: {exc}"
        after = dict(trainer.model.named_parameters())
        result.params_changed = all(not torch.equal(before[n], after[n]) for n in before)
    return result


def same_figures(trl: Run, ours: Run) -> None:
    """Every figure TRL logged, ours logged with the same value at the same step (NaN equal to NaN); timings aside."""
    assert trl.error is None and ours.error is None, (trl.error, ours.error)
    assert len(trl.logs) == len(ours.logs), (len(trl.logs), len(ours.logs))
    for step, (theirs, mine) in enumerate(zip(trl.logs, ours.logs)):
        for key, value in theirs.items():
            if key in TIMING_KEYS:
                continue
            assert key in mine, f"log {step}: {ours.flavour} did not log {key}"
            both_nan = isinstance(value, float) and math.isnan(value) and math.isnan(mine[key])
            assert both_nan or mine[key] == value, f"log {step}: {key} = {mine[key]} ({ours.flavour}), {value} (TRL)"
