"""Shared pieces of the integration tests: a trainer of either kind on a tiny model, and a recorder of every id the
generator produced (the reference of token exactness)."""

from __future__ import annotations

from typing import Any


def config(config_class: Any, tmp_path: Any, **extra: Any) -> Any:
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=128, max_tokens_per_turn=64, max_turns=4, max_steps=2, learning_rate=1e-3,
                  report_to="none", use_cpu=True, bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return config_class(**{**values, **extra})


def trainer_of(kind: str, tmp_path: Any, **kwargs: Any) -> Any:
    """An ``AgenticGRPOTrainer`` (``kind="grpo"``) or ``AgenticPPOTrainer`` (``"ppo"``, one generation per row, a
    KL penalty) over ``kwargs`` (model, processing_class, train_dataset, reward_funcs, and the rollout's argument);
    ``args`` extra fields may be given as ``config={...}``."""
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    extra = kwargs.pop("config", {})
    if kind == "grpo":
        return AgenticGRPOTrainer(args=config(AgenticGRPOConfig, tmp_path, **extra), **kwargs)
    args = config(AgenticPPOConfig, tmp_path, beta=0.05, **extra)
    args.num_generations = 1
    return AgenticPPOTrainer(args=args, **kwargs)


class Recording:
    """Wraps a generator and keeps the ids of every output it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.outputs = inner, []

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        out = self.inner.generate(prompts, max_new_tokens, stop_strings, eos_token_ids)
        self.outputs.extend(list(g.ids) for g in out)
        return out


def record(trainer: Any) -> tuple[Recording, list]:
    """Wrap the trainer's generator (every generated output kept) and its rounds (every round's runs kept)."""
    seam = trainer.rollout_seam
    holder = seam.engine if hasattr(seam, "engine") else seam  # the engine's seams, or the agents'
    recording = holder.generator = Recording(holder.generator)
    rounds, original = [], type(trainer).generation_round

    def keep(self, rows):
        round_ = original(self, rows)
        rounds.append(round_)
        return round_

    trainer.generation_round = keep.__get__(trainer)
    return recording, rounds


def assert_token_exact(runs: list, recording: Recording) -> None:
    """Every sampled span of every segment is a prefix of an output the generator returned, for the turn it was
    sampled in (the ids trained are the ids sampled)."""
    for run in runs:
        for segment in run.training_rows():
            for ids, raw in zip(segment.agent_segments(), segment.generated_ids):
                assert raw in recording.outputs and ids == raw[: len(ids)]


def logged(trainer: Any) -> set[str]:
    return {key for entry in trainer.state.log_history for key in entry}


def two_ways(tokenizer: Any, plans: dict[str, list[str]]) -> Any:
    """A generator that plays one of two ``plans`` (each a list of turns' texts) per rollout: of the rollouts that
    start from the same prompt, the first plays the first plan and the next the second, in turn (so the two samples
    of a GRPO group play both, whatever order the engine asks in); a later turn keeps the plan its first turn chose
    (read from the conversation)."""
    from collections import Counter

    from helpers import ScriptedGenerator

    names, seen = list(plans), Counter()
    header, end = "<|im_start|>assistant\n", "<|im_end|>"

    def script(ids: list[int]) -> str:
        text = tokenizer.decode(ids)
        turns = text.split(header)[1:]  # the turns so far, then the one to write
        if len(turns) == 1:
            name = names[seen[text] % len(names)]
            seen[text] += 1
        else:
            first = turns[0].split(end)[0]
            name = next(n for n in names if plans[n][0] == first)
        return plans[name][len(turns) - 1] + end

    return ScriptedGenerator(tokenizer, script)


def train_two_ways(trainer: Any, tokenizer: Any, plans: dict[str, list[str]]) -> tuple[Any, list[str]]:
    """Train ``trainer`` (its rounds' turns written by :func:`two_ways`); its first round, and the plan each of the
    round's runs played (each plan by as many runs)."""
    trainer.rollout_seam.engine.generator = two_ways(tokenizer, plans)
    _, rounds = record(trainer)
    trainer.train()
    played = [next(name for name, turns in plans.items() if run.actions == turns) for run in rounds[0].runs]
    assert sorted(played) == sorted(list(plans) * (len(played) // len(plans))), played
    return rounds[0], played


def gigpo_logged(trainer: Any) -> tuple[float, float]:
    """The last logged ``gigpo/anchored_step_share`` and ``gigpo/step_group_size_mean``."""
    entry = [row for row in trainer.state.log_history if "gigpo/anchored_step_share" in row][-1]
    return entry["gigpo/anchored_step_share"], entry["gigpo/step_group_size_mean"]
