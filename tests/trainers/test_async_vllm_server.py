"""Asynchronous rollouts on vLLM's server (``use_vllm=True, vllm_mode="server", max_staleness=1``): TRL's own
``VLLMGeneration`` (its weight sync, its sampling settings) with the transport stubbed by a server that really
generates: :class:`ModelServer` holds a model, loads the weights TRL pushes and samples with them, so a test can
check which weights sampled each trained run.

What must hold: each run was sampled by the weights of the version it carries (the server's weights at its
generation calls are the policy's at that version); no generation call runs while the weights change; the jobs'
requests carry only this process's prompts, from the background thread, with TRL's sampling fields; the correction
uses the server's log-probs; settings the server cannot serve are refused in one line."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from helpers import agentic_args, assert_rounds_behind, lookup_dataset
from transformers import AutoModelForCausalLM, GenerationConfig, TrainerCallback

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.compat import vllm_server_generate
from trl_agentic.rollout.generation import HFGenerator
from trl_agentic.rollout.vllm import stop_kwargs
from trl_agentic.toy import LookupEnvironment, lookup_reward

STEPS = 4
BATCH = 4


def fingerprint(named: dict[str, torch.Tensor]) -> tuple[float, ...]:
    """The weights' values, summed per tensor in name order: equal weights give equal fingerprints, bit for bit."""
    return tuple(float(named[name].detach().double().sum()) for name in sorted(named))


class ModelServer:
    """``VLLMClient`` over a model of its own instead of a server: ``update_named_params`` loads what TRL pushes
    (every name must be the model's), ``generate`` samples with the model as it is then (transformers, the request's
    temperature, stop strings and end ids, the sampled ids' log-probs) and records each call: its thread, prompts,
    completions and the weights' :func:`fingerprint`. A push is slowed down between tensors, so that a generation
    call overlapping it would be seen (``overlaps``)."""

    def __init__(self, model_dir: str, tokenizer) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tokenizer = tokenizer
        self.calls: list[dict] = []
        self.pushes = 0
        self.overlaps = 0
        self._pushing = threading.Event()
        self._generating = threading.Lock()

    def init_communicator(self, device=0) -> None:
        pass

    def reset_prefix_cache(self) -> None:
        pass

    def get_server_info(self) -> dict:
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}  # sampled at temperature 1: the same

    def update_named_params(self, metadata, params) -> None:
        own = dict(self.model.named_parameters())
        self._pushing.set()
        if self._generating.locked():
            self.overlaps += 1
        with torch.no_grad():
            for name, param in params:
                own[name].copy_(param)  # a KeyError: TRL pushed a name the model does not have
                time.sleep(0.001)
        self._pushing.clear()
        self.pushes += 1

    def generate(self, prompts, features=None, n=1, repetition_penalty=1.0, temperature=1.0, top_p=1.0, top_k=0,
                 min_p=0.0, max_tokens=16, logprobs=0, structured_outputs_regex=None, generation_kwargs=None):
        kwargs = dict(generation_kwargs or {})
        with self._generating:
            if self._pushing.is_set():
                self.overlaps += 1
            weights = fingerprint(dict(self.model.named_parameters()))
            config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
            generator = HFGenerator(self.model, self.tokenizer, config, return_logprobs=True)
            out = [generator.generate([p], max_tokens, kwargs.get("stop", []), kwargs["stop_token_ids"])[0]
                   for p in prompts for _ in range(n)]
        self.calls.append({"thread": threading.current_thread().name, "prompts": [list(p) for p in prompts],
                           "completions": [list(g.ids) for g in out], "weights": weights, "n": n,
                           "max_tokens": max_tokens, "logprobs": logprobs, "kwargs": kwargs})
        return {"prompt_ids": [list(p) for p in prompts], "completion_ids": [list(g.ids) for g in out],
                "logprobs": [[[lp] for lp in g.logprobs] for g in out],
                "logprob_token_ids": [[[i] for i in g.ids] for g in out]}


@pytest.fixture
def server(monkeypatch, tiny_model_dir, tokenizer):
    """TRL's ``VLLMGeneration`` builds a :class:`ModelServer` for its client (vLLM itself is not installed here)."""
    import trl.generation.vllm_generation as vllm_generation

    stub = ModelServer(tiny_model_dir, tokenizer)
    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda *args, **kwargs: True)
    monkeypatch.setattr(vllm_generation, "VLLMClient", lambda **kwargs: stub)
    return stub


class VersionWeights(TrainerCallback):
    """The policy's :func:`fingerprint` at every version: before training (0) and after each optimizer step."""

    def __init__(self) -> None:
        self.by_version: dict[int, tuple[float, ...]] = {}
        self.trainer = None

    def _record(self, state) -> None:
        self.by_version[state.global_step] = fingerprint(dict(self.trainer.model.named_parameters()))

    def on_train_begin(self, args, state, control, **kwargs):
        self._record(state)

    def on_step_end(self, args, state, control, **kwargs):
        self._record(state)


def agent_tokens_reward(completions, trajectory, **kwargs):
    """Rewards that differ within a group, so that every step moves the weights."""
    return [t.num_agent_tokens / 10 for t in trajectory]


def _trainer(tmp_path, tiny_model_dir, tokenizer, eval_dataset=None, **overrides):
    args = agentic_args(tmp_path, **{"max_steps": STEPS, "use_vllm": True, "vllm_mode": "server",
                                     "max_staleness": 1, "temperature": 1.0, **overrides})
    return AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[lookup_reward, agent_tokens_reward], args=args,
                              train_dataset=lookup_dataset(16), processing_class=tokenizer,
                              environment=LookupEnvironment, eval_dataset=eval_dataset)


def test_each_run_was_sampled_by_the_weights_of_its_version(server, tiny_model_dir, tokenizer, tmp_path):
    trainer = _trainer(tmp_path, tiny_model_dir, tokenizer, eval_dataset=lookup_dataset(4), eval_strategy="steps",
                       eval_steps=2, per_device_eval_batch_size=4)
    versions = VersionWeights()
    versions.trainer = trainer
    trainer.add_callback(versions)
    trained = []
    original = trainer.rollout

    def recording(rows, ahead=True):
        rollouts = original(rows, ahead)
        if trainer.model.training:
            trained.extend(rollouts.runs)
        return rollouts

    trainer.rollout = recording
    trainer.train()

    assert_rounds_behind(trainer, STEPS, BATCH)
    assert len(set(versions.by_version.values())) == STEPS + 1  # every step moved the weights
    assert server.overlaps == 0  # no generation call while the weights changed
    background = [c for c in server.calls if c["thread"] == "trl-agentic-rollouts"]
    assert background and len(background) < len(server.calls)  # the evaluations' calls ran on the training thread
    assert all(c["n"] == 1 and c["logprobs"] == 0 for c in background)
    for run in trained:
        first_turn = run.completion_ids[:len(run.generated_ids[0])]
        call = next(c for c in background for p, out in zip(c["prompts"], c["completions"])
                    if p == list(run.prompt_ids) and out == list(first_turn))
        assert call["weights"] == versions.by_version[run.policy_version], run.policy_version
    assert sorted({run.policy_version for run in trained}) == list(range(STEPS - 1))
    # one push per version the jobs needed (0 is the server's own), and one more at each evaluation's step
    assert 1 <= server.pushes <= STEPS + STEPS // 2


def test_the_request_is_trls_server_request_for_this_process_alone(server, tiny_model_dir, tokenizer, tmp_path):
    """vllm_server_generate sends what TRL's server-mode generate sends (its sampling fields, read from the same
    backend), with the turn's end in generation_kwargs: the contract with TRL 1.16 ``VLLMGeneration.generate``."""
    trainer = _trainer(tmp_path, tiny_model_dir, tokenizer, top_p=0.9, top_k=5, min_p=0.05,
                       repetition_penalty=1.1, generation_kwargs={"seed": 3})
    backend = trainer.vllm_generation
    prompts = [[5, 6, 7], [8, 9]]
    end = stop_kwargs(["</answer>"], [tokenizer.eos_token_id])
    saved_max, saved_kwargs = backend.max_completion_length, backend.generation_kwargs
    backend.max_completion_length, backend.generation_kwargs = 7, {**saved_kwargs, **end}
    backend.generate(prompts=prompts, images=None, num_generations=1)  # TRL's own request (one process: no gather)
    backend.max_completion_length, backend.generation_kwargs = saved_max, saved_kwargs
    ids, logprobs = vllm_server_generate(backend, server, prompts, 7, end)
    trl_call, ours = server.calls[-2], server.calls[-1]
    assert {k: v for k, v in ours.items() if k not in ("completions", "weights", "thread")} == \
        {k: v for k, v in trl_call.items() if k not in ("completions", "weights", "thread")}
    assert ours["kwargs"]["seed"] == 3 and ours["kwargs"]["stop"] == ["</answer>"]
    assert [len(row) for row in ids] == [len(row) for row in logprobs] and all(len(row) <= 7 for row in ids)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"vllm_mode": "colocate"}, "pass vllm_mode='server'"),
    ({"max_staleness": 2}, "pass max_staleness=1"),
    ({"async_generator": "process"}, "leave async_generator='thread'"),
])
def test_settings_the_server_cannot_serve_are_refused_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message) as caught:
        agentic_args(tmp_path, **{"use_vllm": True, "vllm_mode": "server", "max_staleness": 1, **overrides})
    assert "\n" not in str(caught.value)
