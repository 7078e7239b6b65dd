"""TRL 1.16's ``tools=`` and ``environment_factory=`` through our engine: TRL's documented examples train with both
of our trainers, and on identical scripted token streams our trainer builds the batch TRL's own tool loop builds."""

from __future__ import annotations

import os

import pytest
import torch
from conventions import build_convention
from helpers import native_call as call
from helpers import scripted

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")




@pytest.fixture(scope="module")
def qwen():
    return build_convention("qwen2.5-instruct")


# -- TRL's documented examples (TRL 1.16 docs, "Tools" and "Environments" of the GRPO trainer) -------------------
def multiply(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class IncrementEnv:
    def reset(self, target, **kwargs) -> None:
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


def increment_dataset():
    from datasets import Dataset

    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}] for i in range(1, 7)],
        "target": list(range(1, 7)),
    })


def _config(config_class, tmp_path, **extra):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=96, max_steps=2, learning_rate=1e-3, report_to="none", use_cpu=True,
                  bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return config_class(**{**values, **extra})


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_trl_environment_factory_example_trains(qwen, tmp_path, trainer_name):
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    seen = []

    def reward_func(completions, environments, **kwargs):  # reads the environments, as TRL allows
        seen.append([type(e).__name__ for e in environments])
        return [float(len(c)) for c in completions]

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("increment", step=2) + "\n" + call("increment", step=1), "Done."])
    if trainer_name == "grpo":  # TRL's config, unchanged
        trainer = AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                     reward_funcs=reward_func, args=_config(GRPOConfig, tmp_path),
                                     environment_factory=IncrementEnv)
    else:
        args = _config(AgenticPPOConfig, tmp_path, rollout_mode="chat", max_tokens_per_turn=96, beta=0.05)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                    reward_funcs=reward_func, args=args, environment_factory=IncrementEnv)
    assert trainer.reward_func_names == ["reward_func", "IncrementEnv"]
    trainer.train()
    assert trainer.state.global_step == 2 and seen and all(names == ["IncrementEnv"] * len(names) for names in seen)
    logged = {k for entry in trainer.state.log_history for k in entry}
    assert "rewards/IncrementEnv/mean" in logged and "agentic/tool_calls/increment_per_trajectory" in logged
    # every rollout called increment twice (2, then 1): the environment reached 3, and only target 3 is rewarded
    calls = [e["agentic/tool_calls/increment_per_trajectory"] for e in trainer.state.log_history
             if "agentic/tool_calls/increment_per_trajectory" in e]
    assert calls and all(c == 2.0 for c in calls)


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_trl_tools_example_trains(qwen, tmp_path, trainer_name):
    from datasets import Dataset
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    def reward_func(completions, **kwargs):
        return [float("42" in c[-1]["content"]) for c in completions]

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": "What is 6 times 7?"}]] * 4})
    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("multiply", a=6, b=7), "It is 42."])
    if trainer_name == "grpo":
        trainer = AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=dataset,
                                     reward_funcs=reward_func, args=_config(GRPOConfig, tmp_path), tools=[multiply])
    else:
        args = _config(AgenticPPOConfig, tmp_path, rollout_mode="chat", max_tokens_per_turn=96, beta=0.05)
        args.num_generations = 1
        trainer = AgenticPPOTrainer(model=model, processing_class=tok, train_dataset=dataset,
                                    reward_funcs=reward_func, args=args, tools=[multiply])
    trainer.train()
    rewards = [e["rewards/reward_func/mean"] for e in trainer.state.log_history if "rewards/reward_func/mean" in e]
    assert trainer.state.global_step == 2 and rewards == [1.0, 1.0]  # the reward read the final answer


def test_dict_factory_picks_the_rows_environment(qwen):
    from trl_agentic.environments.trl_environments import TRLEnvironments

    class Other:
        def reset(self, **row):
            return " (other)"

        def ping(self) -> str:
            """Ping."""
            return "pong"

    source = TRLEnvironments(environment_factory={"inc": IncrementEnv, "other": Other})
    env = source()
    assert env.reset(environment="other", prompt="p") == " (other)"
    assert [t.__name__ for t in env.tools] == ["ping"]
    env = source()
    assert env.reset(environment="inc", target=3) is None and [t.__name__ for t in env.tools] == ["increment"]
    with pytest.raises(ValueError, match="not among the environments"):
        source().reset(environment="missing")


def test_environment_and_trl_arguments_together_are_refused(qwen, tmp_path):
    from helpers import EchoEnvironment
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer

    with pytest.raises(ValueError, match="not both"):
        AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=lambda completions, **k: [0.0] * len(completions),
                           args=_config(GRPOConfig, tmp_path), train_dataset=increment_dataset(),
                           environment=EchoEnvironment, tools=[multiply])


# -- parity with TRL's own tool loop ------------------------------------------------------------------------------
def test_batch_equals_trl_tool_loop(qwen, tmp_path):
    """Several turns, two calls per turn, a raising call, an unknown tool, a malformed call (on the last turn, where
    TRL stops and we answer it but the turn budget ends the rollout): the same batch as TRL 1.16's GRPOTrainer."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOTrainer

    turns = [
        call("multiply", a=2, b=3) + "\n" + call("divide", a=1, b=0),
        call("multiply", a=4, c=5) + "\n" + call("multiply", a="6", b=7),
        '<tool_call>\n{"name": "multiply", "arguments": {"a": </tool_call>',
    ]
    rows = [{"prompt": [{"role": "user", "content": f"Compute {i}."}]} for i in range(4)]

    rewards = {}

    def reward_func(completions, **kwargs):  # depends on the messages and on the row
        values = [sum(m["role"] == "tool" for m in c) + 0.5 * (i % 2) + len(c[-1]["content"]) / 100
                  for i, c in enumerate(completions)]
        rewards[name] = values
        return values

    batches = {}
    for name in ("trl", "ours"):
        tok = qwen.load_tokenizer()
        torch.manual_seed(0)
        model = scripted(qwen.load_model(), tok, turns)
        args = _config(GRPOConfig, tmp_path / name, max_tool_calling_iterations=2, beta=0.0)
        args.max_completion_length = 400
        trainer_class = GRPOTrainer if name == "trl" else AgenticGRPOTrainer
        trainer = trainer_class(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                reward_funcs=reward_func, args=args, tools=[multiply])
        if name == "trl":
            batch = trainer._generate_and_score_completions([dict(r) for r in rows])
        else:
            batch = trainer.training_batch([dict(r) for r in rows]).data
        batches[name] = batch
    trl, ours = batches["trl"], batches["ours"]
    assert rewards["trl"] == rewards["ours"] and len(set(rewards["trl"])) > 1
    for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "tool_mask", "advantages"):
        assert torch.equal(trl[key], ours[key]), key
    assert trl["tool_mask"].sum() < trl["completion_mask"].sum()  # observations were masked
    text = qwen.tokenizer.decode(ours["completion_ids"][0])
    assert "Tool divide not found." in text and "unexpected keyword argument 'c'" in text


def test_reset_text_joins_the_last_user_message_and_a_failing_reset_costs_its_rollout(qwen):
    from helpers import ScriptedGenerator

    from trl_agentic.environments.trl_environments import TRLEnvironments
    from trl_agentic.rollout.config import RolloutConfig
    from trl_agentic.rollout.engine import RolloutEngine

    class Quiz:
        def reset(self, level=None, **row):
            if level == "broken":
                raise RuntimeError("no such level")
            return f" Level {level}: <|im_end|> is just text."

        def answer(self, value: str) -> str:
            """Submit an answer.

            Args:
                value: The answer.
            """
            return "ok"

    tok = qwen.load_tokenizer()
    source = TRLEnvironments([multiply], Quiz)
    generator = ScriptedGenerator(tok, lambda ids: "Done.<|im_end|>")
    engine = RolloutEngine(generator, tok, source, RolloutConfig(rollout_mode="chat", max_tokens_per_turn=50,
                                                                 max_completion_length=100, overlap_chunks=1),
                           eos_token_ids=list(qwen.eos_token_ids))
    prompt = [{"role": "user", "content": "Play."}]
    envs = [source(), source()]
    ok, broken = engine.run([prompt, prompt], [{"level": 1}, {"level": "broken"}], environments=envs)
    rendered = tok.apply_chat_template([{"role": "user", "content": "Play. Level 1: <|im_end|> is just text."}],
                                       tools=[multiply, envs[0].instance.answer], add_generation_prompt=True,
                                       tokenize=False)
    assert tok.decode(ok.prompt_ids) == rendered  # schemas of tools= and of the methods; reset text appended
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert ok.prompt_ids.count(im_end) == rendered.count("<|im_end|>") - 1  # the reset text's stays text
    assert ok.stop_reason == "terminated" and broken.stop_reason == "env_error" and "no such level" in broken.error


# -- the edges of TRL's contract, checked against TRL's own trainer ---------------------------------------------------
def _both(qwen, tmp_path, rows, turns, **kwargs):
    """TRL 1.16's GRPOTrainer and ours, built from the same arguments (each its own scripted model); for each, the
    trainer, or the message of the error its constructor raised."""
    from trl import GRPOTrainer

    from trl_agentic import AgenticGRPOTrainer

    built = {}
    for name, trainer_class in (("trl", GRPOTrainer), ("ours", AgenticGRPOTrainer)):
        tok = qwen.load_tokenizer()
        torch.manual_seed(0)
        model = scripted(qwen.load_model(), tok, turns)
        arguments = {k: (v(tmp_path / name) if k == "args" and callable(v) else v) for k, v in kwargs.items()}
        try:
            built[name] = trainer_class(model=model, processing_class=tok, **arguments)
        except Exception as exc:  # noqa: BLE001 - the message is compared
            built[name] = f"{type(exc).__name__}: {exc}"
    return built["trl"], built["ours"]


def _reward_metrics(trainer):
    """The reward metrics TRL logged for the round just scored (under "eval" while the model is in eval mode)."""
    return {k: v for k, v in trainer._metrics["train" if trainer.model.training else "eval"].items()
            if k.startswith("reward")}


def test_get_reward_with_reward_weights_matches_trl(qwen, tmp_path):
    """TRL checks reward_weights against the user's reward functions and gives get_reward weight 1 after them, logged
    under the class's name: ours builds the same weights, names, rewards, metrics and advantages."""
    from trl import GRPOConfig

    def reward_func(completions, **kwargs):
        return [len(c[-1]["content"]) / 10 for c in completions]

    rows = [{"prompt": [{"role": "user", "content": f"Count to {t}."}], "target": t} for t in (3, 3, 1, 1)]
    turns = [call("increment", step=2) + "\n" + call("increment", step=1), "Done."]
    trl, ours = _both(qwen, tmp_path, rows, turns, train_dataset=increment_dataset(), reward_funcs=reward_func,
                      environment_factory=IncrementEnv,
                      args=lambda d: _config(GRPOConfig, d, reward_weights=[0.5], beta=0.0))
    assert torch.equal(trl.reward_weights, torch.tensor([0.5, 1.0])) and torch.equal(ours.reward_weights, trl.reward_weights)
    assert ours.reward_func_names == trl.reward_func_names == ["reward_func", "IncrementEnv"]
    trl_batch = trl._generate_and_score_completions([dict(r) for r in rows])
    ours_batch = ours.training_batch([dict(r) for r in rows]).data
    assert torch.equal(trl_batch["advantages"], ours_batch["advantages"])
    assert _reward_metrics(ours) == _reward_metrics(trl) and _reward_metrics(trl)["rewards/IncrementEnv/mean"] == [0.5]


def test_reward_weights_counted_with_the_environment_reward_fail_as_in_trl(qwen, tmp_path):
    from trl import GRPOConfig

    trl, ours = _both(qwen, tmp_path, [], ["Done."], train_dataset=increment_dataset(),
                      reward_funcs=lambda completions, **k: [0.0] * len(completions), environment_factory=IncrementEnv,
                      args=lambda d: _config(GRPOConfig, d, reward_weights=[0.5, 1.0]))
    assert isinstance(ours, str) and ours == trl
    assert "Number of reward weights (2) must match number of reward functions (1)" in ours


def test_args_none_gives_trls_default_config(qwen, tmp_path, monkeypatch):
    """args=None: TRL builds GRPOConfig("<model name>-GRPO"); ours the same values, as an AgenticGRPOConfig with
    TRL's tool-loop budgets (and AgenticPPOTrainer an AgenticPPOConfig)."""
    from trl_agentic import AgenticGRPOConfig, AgenticPPOConfig, AgenticPPOTrainer

    monkeypatch.chdir(tmp_path)
    reward = lambda completions, **k: [0.0] * len(completions)  # noqa: E731
    common = {"train_dataset": increment_dataset(), "reward_funcs": reward, "environment_factory": IncrementEnv}
    if not torch.cuda.is_available():  # TRL's default bf16=True refuses a CPU-only machine; ours trains in float32
        trl, ours = _both(qwen, tmp_path, [], ["Done."], **common)  # there (docs/trl-differences.md)
        assert isinstance(trl, str) and "use_cpu" in trl and ours.args.bf16 is False
        monkeypatch.setattr("transformers.training_args.is_torch_bf16_gpu_available", lambda: True)
    trl, ours = _both(qwen, tmp_path, [], ["Done."], **common)
    assert isinstance(ours.args, AgenticGRPOConfig) and ours.args.output_dir == trl.args.output_dir
    assert ours.args.output_dir.endswith("-GRPO") and ours.args.rollout_mode == "chat"
    assert ours.args.max_tokens_per_turn == trl.args.max_completion_length
    assert ours.args.learning_rate == trl.args.learning_rate and ours.args.num_generations == trl.args.num_generations
    tok = qwen.load_tokenizer()
    ppo = AgenticPPOTrainer(model=qwen.load_model(), processing_class=tok, train_dataset=increment_dataset(),
                            reward_funcs=reward, tools=[multiply])
    assert isinstance(ppo.args, AgenticPPOConfig) and ppo.args.rollout_mode == "chat"
    assert ppo.args.output_dir.endswith("-PPO")


def test_positional_trl_config_gets_the_tool_loop_budgets(qwen, tmp_path):
    """GRPOTrainer(model, reward_funcs, args, train_dataset): the config given by position is converted too."""
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    tok = qwen.load_tokenizer()
    trainer = AgenticGRPOTrainer(qwen.load_model(), lambda completions, **k: [0.0] * len(completions),
                                 _config(GRPOConfig, tmp_path), increment_dataset(), processing_class=tok,
                                 tools=[multiply])
    assert isinstance(trainer.args, AgenticGRPOConfig) and trainer.args.rollout_mode == "chat"


class Counter(IncrementEnv):
    """Owns its data (TRL's dataset-free environment): ``reset`` writes the task."""

    def reset(self, **kwargs) -> str:
        self.counter, self.target = 0, 3
        return "Increment the counter to 3."


def test_environment_factory_without_dataset_as_in_trl(qwen, tmp_path):
    """TRL 1.16 trains without train_dataset when a single environment_factory writes the prompt in reset()
    (placeholder rows of one empty user message, max_steps required): ours builds the same rows and prompts and
    trains; the two cases TRL refuses fail with TRL's message."""
    from trl import GRPOConfig

    turns = [call("increment", step=3), "Done."]
    trl, ours = _both(qwen, tmp_path, [], turns, reward_funcs=None, environment_factory=Counter,
                      args=lambda d: _config(GRPOConfig, d, max_steps=1))
    assert ours.train_dataset.to_list() == trl.train_dataset.to_list()
    trl_batch = trl._generate_and_score_completions([dict(r) for r in trl.train_dataset] * 2)
    ours_batch = ours.training_batch([dict(r) for r in ours.train_dataset] * 2).data
    for key in ("prompt_ids", "completion_ids", "tool_mask", "advantages"):
        assert torch.equal(trl_batch[key], ours_batch[key]), key
    assert "Increment the counter to 3." in qwen.tokenizer.decode(ours_batch["prompt_ids"][0])
    assert _reward_metrics(ours) == _reward_metrics(trl) and _reward_metrics(trl)["rewards/Counter/mean"] == [1.0]
    ours.train()
    assert ours.state.global_step == 1
    for refused in ({"environment_factory": Counter, "args": lambda d: _config(GRPOConfig, d, max_steps=-1)},
                    {"environment_factory": {"a": Counter}, "args": lambda d: _config(GRPOConfig, d)},
                    {"tools": [multiply], "args": lambda d: _config(GRPOConfig, d)}):
        trl, ours = _both(qwen, tmp_path, [], ["Done."], reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          **refused)
        assert isinstance(trl, str) and ours == trl


# -- issue 32: the config swapped too, and evaluation scoring what training scores ---------------------------------
@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_agentic_config_with_trl_tools_infers_chat_and_trls_budgets(qwen, tmp_path, trainer_name):
    """AgenticGRPOConfig / AgenticPPOConfig + tools=: the rollout fields left unset take TRL's tool loop's values
    (chat, a turn may use the whole budget, max_tool_calling_iterations + 1 turns); set ones are kept, and an explicit
    rollout_mode='text' is still refused."""
    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    trainer_class, config_class = ((AgenticGRPOTrainer, AgenticGRPOConfig) if trainer_name == "grpo"
                                   else (AgenticPPOTrainer, AgenticPPOConfig))
    reward = lambda completions, **k: [0.0] * len(completions)  # noqa: E731
    common = dict(processing_class=qwen.load_tokenizer(), train_dataset=increment_dataset(), reward_funcs=reward,
                  tools=[multiply])
    args = _config(config_class, tmp_path, max_tool_calling_iterations=3)
    trainer = trainer_class(model=qwen.load_model(), args=args, **common)
    assert (trainer.args.rollout_mode, trainer.args.max_turns, trainer.args.max_tokens_per_turn) == ("chat", 4, 96)
    assert args.rollout_mode == "text"  # the caller's config is left as it was
    kept = trainer_class(model=qwen.load_model(), args=_config(config_class, tmp_path, max_turns=2), **common)
    assert (kept.args.max_turns, kept.args.max_tokens_per_turn) == (2, 96)
    with pytest.raises(ValueError, match="rollout_mode='chat'"):
        trainer_class(model=qwen.load_model(), args=_config(config_class, tmp_path, rollout_mode="text"), **common)


def test_evaluation_gives_reward_functions_what_training_gives_them(qwen, tmp_path):
    """trl_agentic.evaluate on TRL's environment_factory: the reward functions receive the same prompts (reset text
    appended), completions (the rollout's messages) and environments as in a training round."""
    from trl import GRPOConfig

    from trl_agentic import AgenticGRPOTrainer
    from trl_agentic.environments.trl_environments import TRLEnvironments
    from trl_agentic.evaluate import evaluate
    from trl_agentic.rollout.generation import HFGenerator

    class Quiz(IncrementEnv):
        def reset(self, target, **kwargs) -> str:
            super().reset(target)
            return f" Reach {target}."

    received = {}

    def reward(prompts, completions, environments, **kwargs):
        received[where] = (prompts, completions, [type(e).__name__ for e in environments])
        return [float(e.counter == e.target) for e in environments]

    turns = [call("increment", step=2) + "\n" + call("increment", step=1), "Done."]
    rows = [dict(r) for r in increment_dataset()][2:4]  # targets 3 and 4
    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, turns)
    where = "training"
    trainer = AgenticGRPOTrainer(model=model, processing_class=tok, train_dataset=increment_dataset(),
                                 reward_funcs=reward, args=_config(GRPOConfig, tmp_path, max_completion_length=256),
                                 environment_factory=Quiz)
    trainer.training_batch(rows)
    where = "evaluation"
    generator = HFGenerator(model, tok, model.generation_config)
    report, _ = evaluate(model, tok, TRLEnvironments(environment_factory=Quiz), rows, reward, generator=generator,
                         show_progress=False, **{k: getattr(trainer.args, k) for k in
                                                 ("rollout_mode", "max_turns", "max_tokens_per_turn",
                                                  "max_completion_length")})
    assert received["evaluation"] == received["training"]
    prompts, completions, names = received["training"]
    assert prompts[0][-1]["content"].endswith(" Reach 3.") and names == ["Quiz", "Quiz"]
    assert [m["role"] for m in completions[0]] == ["assistant", "tool", "tool", "assistant"], completions[0]
    assert report.accuracy == 0.5  # both counters reach 3: target 3 is met, target 4 is not


class UndocumentedEnv:
    def reset(self, **kwargs) -> None:
        self.counter = 0

    def increment(self, step):  # no docstring, no type hint: transformers cannot write its schema
        self.counter += step
        return self.counter


@pytest.mark.parametrize("given", ["environment_factory", "tools"])
def test_a_tool_without_a_schema_is_refused_at_construction(qwen, tmp_path, given):
    """TRL 1.16 builds the trainer and fails in the first rollout (transformers' DocstringParsingException, deep in
    apply_chat_template); ours refuses at construction, in one line naming the tool (docs/trl-differences.md)."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOTrainer

    def lookup(key: str) -> str:
        return key

    kwargs = {"environment_factory": UndocumentedEnv} if given == "environment_factory" else {"tools": [lookup]}
    name = "UndocumentedEnv.increment" if given == "environment_factory" else \
        "test_a_tool_without_a_schema_is_refused_at_construction.<locals>.lookup"
    common = dict(train_dataset=increment_dataset(), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                  args=_config(GRPOConfig, tmp_path), **kwargs)
    GRPOTrainer(model=qwen.load_model(), processing_class=qwen.load_tokenizer(), **common)  # TRL: built
    with pytest.raises(ValueError, match=f"tool '{name}' cannot be described to the model .*: give it type hints and "
                       "a Google-style docstring"):
        AgenticGRPOTrainer(model=qwen.load_model(), processing_class=qwen.load_tokenizer(), **common)
