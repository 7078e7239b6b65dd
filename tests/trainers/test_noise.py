"""Our trainers print no warning a user cannot act on: TRL's "rollout_func is experimental" (our rounds do not use
rollout_func) and transformers' gradient_checkpointing FutureWarning (TRL's default)."""

from __future__ import annotations

import warnings

from helpers import agentic_args, lookup_dataset, ppo_args

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.toy import LookupEnvironment, lookup_reward


def test_configs_do_not_warn_about_their_defaults(tmp_path):
    for make in (agentic_args, ppo_args):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            args = make(tmp_path)
        assert args.activation_checkpointing is True and args.gradient_checkpointing is True  # TRL's default kept
    assert agentic_args(tmp_path, activation_checkpointing=False).gradient_checkpointing is False


def test_trainer_does_not_warn_that_rollout_func_is_experimental(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    monkeypatch.delenv("TRL_EXPERIMENTAL_SILENCE", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=agentic_args(tmp_path),
                           train_dataset=lookup_dataset(8), processing_class=tokenizer, environment=LookupEnvironment)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "rollout_func" in m or "gradient_checkpointing" in m], messages
