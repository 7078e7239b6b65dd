"""Refactoring the trainers changes nothing in meaning: after three synchronous steps (``max_staleness=0``) the trained
parameters are bit for bit those the trainers produced before issue 53 moved the rollouts ahead of training behind a
rollout source (their SHA-256, recorded on this project's machine with the code of commit c3e8f84: one torch
thread, deterministic algorithms, float32 on the CPU). A change that moves any parameter by one ulp fails here;
a change of machine (another CPU's float summation order) may too: record the hashes again there with the code
before the change, as the docstring of :data:`RECORDED` says."""

from __future__ import annotations

import hashlib

import pytest
import torch
from helpers import agentic_args, lookup_dataset, ppo_args

from trl_agentic.toy import LookupEnvironment, lookup_reward

RECORDED = {
    "grpo": "e2cd5ed27abc99f92274842465e6848804da16e4dacaa166fe2106cb90444384",
    "ppo": "e8785a99000c3987bb1d902f1b00d8972deef30c174fc7778c8b0bd3c0110e07",
    "grpo_k2_beta": "7f262b238966bfffaa389fe19483fedc23de28a55593b56fcd589b98ba0f786b",
}
"""``python -m pytest tests/trainers/test_parameter_hashes.py -s`` prints each case's hash; on the code before a
change, copy them here."""


def agent_tokens_reward(completions, trajectory, **kwargs):
    return [t.num_agent_tokens / 10 for t in trajectory]


def parameter_hash(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.parametrize("case", list(RECORDED))
def test_three_synchronous_steps_give_the_recorded_parameters(tiny_model_dir, tokenizer, tmp_path, case):
    from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        if case == "ppo":
            trainer = AgenticPPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward],
                                        args=ppo_args(tmp_path, max_steps=3), train_dataset=lookup_dataset(16),
                                        processing_class=tokenizer, environment=LookupEnvironment)
        else:
            extra = {"beta": 0.05, "kl_estimator": "k2"} if case == "grpo_k2_beta" else {}
            trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward],
                                         args=agentic_args(tmp_path, max_steps=3, **extra),
                                         train_dataset=lookup_dataset(16), processing_class=tokenizer,
                                         environment=LookupEnvironment)
        trainer.train()
        digest = parameter_hash(trainer.model)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
    print(f"{case}: {digest}")
    from transformers import AutoModelForCausalLM

    assert digest != parameter_hash(AutoModelForCausalLM.from_pretrained(tiny_model_dir))  # the steps trained
    assert digest == RECORDED[case]
