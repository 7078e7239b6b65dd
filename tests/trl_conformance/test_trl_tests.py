"""TRL 1.16's own tests of ``tools=`` and ``environment_factory=`` (``tests/test_grpo_trainer.py``), re-written as
scenarios, run on TRL's trainer and ours with only the class (and the config class) swapped: TRL's assertions hold
for every flavour, and the figures TRL logs are equal to TRL's (:func:`harness.same_figures`)."""

from __future__ import annotations

import pytest
from harness import FLAVOURS, GRPO_FLAVOURS, by_rows, call, policy, reward_model, run, same_figures, zen


# -- TRL's tools and environments ----------------------------------------------------------------------------------
def multiply_tool(a: int, b: int) -> int:
    """
    Multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


async def async_multiply_tool(a: int, b: int) -> int:
    """
    Asynchronously multiplies two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The product of the two integers.
    """
    return a * b


class CounterEnvironment:
    def reset(self, **kwargs) -> None:
        self.resets = getattr(self, "resets", []) + [dict(kwargs)]
        self._counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self._counter += step
        return self._counter


class ScoredCounter(CounterEnvironment):
    def get_reward(self) -> float:
        return float(self._counter)


class EchoEnvironment:
    def reset(self, **kwargs) -> str:
        self.resets = getattr(self, "resets", []) + [dict(kwargs)]
        return "Echo."

    def shout(self, text: str) -> str:
        """
        Shout the given text.

        Args:
            text: Text to shout.

        Returns:
            The text in upper case.
        """
        return text.upper()


class Counting(CounterEnvironment):
    def reset(self, **kwargs) -> str:
        super().reset(**kwargs)
        return "Count."


def _lengths(completions, **kwargs):
    return [float(len(c[-1]["content"])) for c in completions]


# -- the tests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tool", [multiply_tool, async_multiply_tool])
def test_train_with_tools(tmp_path, tool):
    """A valid call, a call with a wrong argument name, no call; after the tools, 'Done!' for the two that called:
    two rows regenerated, tools/call_frequency 2/3, tools/failure_frequency 1/2, every parameter changed."""
    name = tool.__name__
    first = [call(name, a=3, b=4) + "<|im_end|>", call(name, a=3, c=4) + "<|im_end|>",
             "I don't know any tool<|im_end|>"]
    script = by_rows(first, ["Done!<|im_end|>"] * 2)
    config = dict(learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_completion_length=128,
                  max_steps=2)
    runs = {f: run(f, tmp_path, script, config=config, reward_funcs=reward_model(), train_dataset=zen(),
                   tools=[tool]) for f in FLAVOURS}
    for r in runs.values():
        assert r.error is None, (r.flavour, r.error)
        assert r.calls == [3, 2, 3, 2], r.flavour  # each step: the batch, then the two rows that called a tool
        assert r.last("tools/call_frequency") == pytest.approx(2 / 3), r.flavour
        assert r.last("tools/failure_frequency") == pytest.approx(1 / 2), r.flavour
        assert r.params_changed, r.flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_tool_messages_as_trl_writes_them(tmp_path):
    """The tool messages the reward functions receive: the result as str(), a failure as {'error': ...}, no message
    after a turn without a call; the same messages for every flavour."""
    seen = {}

    def reward(completions, **kwargs):
        seen.setdefault(flavour, []).append([[m for m in c if m["role"] == "tool"] for c in completions])
        return [0.0] * len(completions)

    first = [call("multiply_tool", a=3, b=4) + "<|im_end|>", call("multiply_tool", a=3, c=4) + "<|im_end|>",
             call("decrement", step=2) + "<|im_end|>"]
    script = by_rows(first, ["Done!<|im_end|>"] * 3)
    config = dict(per_device_train_batch_size=3, num_generations=3, max_completion_length=128, max_steps=1)
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, script, config=config, reward_funcs=reward, train_dataset=zen(),
                tools=[multiply_tool])
        assert r.error is None, (flavour, r.error)
    expected = [[{"role": "tool", "name": "multiply_tool", "content": "12"}],
                [{"role": "tool", "name": "multiply_tool",
                  "content": str({"error": "multiply_tool() got an unexpected keyword argument 'c'"})}],
                [{"role": "tool", "name": "decrement", "content": str({"error": "Tool decrement not found."})}]]
    assert all(messages == [expected] for messages in seen.values()), seen


def test_sync_results_come_before_async_ones(tmp_path):
    """Calls [async, sync, async] in one turn: TRL appends the sync result first, then the async ones in call order."""
    seen = {}

    async def async_add(a: int, b: int) -> int:
        """
        Adds two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b

    def reward(completions, **kwargs):
        seen[flavour] = [[m["content"] for m in c if m["role"] == "tool"] for c in completions]
        return [0.0] * len(completions)

    turn = "\n".join([call("async_add", a=1, b=1), call("multiply_tool", a=3, b=4), call("async_add", a=2, b=3)])
    script = by_rows([turn + "<|im_end|>"] * 2, ["Done!<|im_end|>"] * 2)
    config = dict(per_device_train_batch_size=2, num_generations=2, max_completion_length=256, max_steps=1)
    for flavour in GRPO_FLAVOURS:
        r = run(flavour, tmp_path, script, config=config, reward_funcs=reward, train_dataset=zen(),
                tools=[multiply_tool, async_add])
        assert r.error is None, (flavour, r.error)
        assert r.last("tools/call_frequency") == 3.0
    assert all(contents == [["12", "2", "5"]] * 2 for contents in seen.values()), seen


def test_train_with_multiple_environments(tmp_path):
    """A dict environment_factory and a dataset with only the environment column: each rollout gets its environment's
    tools, reset() writes the prompt and never receives the environment column."""
    from datasets import Dataset

    first = [call("increment", step=1) + "<|im_end|>", "I won't<|im_end|>",
             call("shout", text="hi") + "<|im_end|>", "Done!<|im_end|>"]
    script = by_rows(first, ["Done!<|im_end|>"] * 2)
    config = dict(learning_rate=0.1, per_device_train_batch_size=4, num_generations=2, shuffle_dataset=False,
                  max_steps=2, max_completion_length=128)
    runs = {}
    for flavour in FLAVOURS:
        dataset = Dataset.from_dict({"environment": ["counter", "echo"] * 8})
        r = run(flavour, tmp_path, script, config=config, reward_funcs=_lengths, train_dataset=dataset,
                environment_factory={"counter": Counting, "echo": EchoEnvironment})
        runs[flavour] = r
        assert r.error is None, (flavour, r.error)
        assert r.last("tools/call_frequency") == pytest.approx(2 / 4), flavour
        assert r.last("tools/failure_frequency") == 0.0, flavour
        instances = r.trainer.environments
        resets = [kwargs for env in instances for kwargs in env.resets]
        assert resets and all("environment" not in kwargs for kwargs in resets), flavour
        assert {type(env).__name__ for env in instances} == {"Counting", "EchoEnvironment"}
        assert r.params_changed, flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_train_with_unknown_environment_raises(tmp_path):
    """A row naming no environment: the trainer is built, and training raises TRL's error."""
    dataset = zen(6).map(lambda row: {"environment": "unknown"})
    config = dict(per_device_train_batch_size=3, num_generations=3, max_steps=1)
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, by_rows(["Done!<|im_end|>"] * 3, []), config=config, reward_funcs=_lengths,
                train_dataset=dataset, environment_factory={"counter": CounterEnvironment})
        assert r.trainer is not None, (flavour, r.error)
        assert r.error is not None and "not among the environments" in r.error, (flavour, r.error)


def test_train_with_environment_factory(tmp_path):
    """One factory, no dataset, a reward model given by path: a valid call, an unknown tool, no call."""
    first = [call("increment", step=1) + "<|im_end|>", call("decrement", step=2) + "<|im_end|>",
             "I won't increment<|im_end|>"]
    script = by_rows(first, ["Done!<|im_end|>"] * 2)
    config = dict(learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_steps=2,
                  max_completion_length=128)
    runs = {}
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, script, config=config, reward_funcs=reward_model(),
                environment_factory=CounterEnvironment)
        runs[flavour] = r
        assert r.error is None, (flavour, r.error)
        assert r.last("tools/call_frequency") == pytest.approx(2 / 3), flavour
        assert r.last("tools/failure_frequency") == pytest.approx(1 / 2), flavour
        assert [env._counter for env in r.trainer.environments] == [1, 0, 0], flavour
        assert r.params_changed, flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_train_with_environment_owned_reward(tmp_path):
    """get_reward() alone scores: its column is named after the class, weight 1; counters 1, 0, 0 give 1/3."""
    first = [call("increment", step=1) + "<|im_end|>", call("decrement", step=2) + "<|im_end|>",
             "I won't increment<|im_end|>"]
    script = by_rows(first, ["Done!<|im_end|>"] * 2)
    config = dict(learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_steps=2,
                  max_completion_length=128)
    runs = {}
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, script, config=config, environment_factory=ScoredCounter)
        runs[flavour] = r
        assert r.error is None, (flavour, r.error)
        assert r.trainer.reward_func_names == ["ScoredCounter"]
        assert r.trainer.reward_weights.tolist() == [1.0]
        names = [tool.__name__ for tool in r.trainer.tools]
        assert "increment" in names and "get_reward" not in names and "reset" not in names
        assert r.last("rewards/ScoredCounter/mean") == pytest.approx(1 / 3), flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_environment_owned_reward_coexists_with_reward_funcs(tmp_path):
    def format_reward(completions, **kwargs):
        return [0.0] * len(completions)

    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, None, train=False, reward_funcs=format_reward, environment_factory=ScoredCounter,
                config=dict(per_device_train_batch_size=3, num_generations=3, max_steps=5, reward_weights=[0.5]))
        assert r.error is None, (flavour, r.error)
        assert r.trainer.reward_func_names == ["format_reward", "ScoredCounter"]
        assert r.trainer.reward_weights.tolist() == [0.5, 1.0] and len(r.trainer.reward_funcs) == 2
        names = [tool.__name__ for tool in r.trainer.tools]
        assert "increment" in names and "get_reward" not in names


def test_environment_owned_reward_mixed_environments(tmp_path):
    """Two names of one class with get_reward and one without: one column, which scores only its class."""
    from datasets import Dataset

    class Plain:
        def reset(self, **kwargs) -> None:
            pass

        def play(self, x: int) -> int:
            """
            Play.

            Args:
                x: A value.
            """
            return x

    def format_reward(completions, **kwargs):
        return [0.0] * len(completions)

    dataset = Dataset.from_dict({"environment": ["scored", "scored2", "plain"]})
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, None, train=False, reward_funcs=format_reward, train_dataset=dataset,
                environment_factory={"scored": ScoredCounter, "scored2": ScoredCounter, "plain": Plain},
                config=dict(per_device_train_batch_size=3, num_generations=3, max_steps=1))
        assert r.error is None, (flavour, r.error)
        assert r.trainer.reward_func_names == ["format_reward", "ScoredCounter"]
        assert r.trainer.reward_weights.tolist() == [1.0, 1.0]
        scored = ScoredCounter()
        scored.reset()
        assert r.trainer.reward_funcs[-1](environments=[scored, Plain()]) == [0.0, None]


@pytest.mark.parametrize("case", ["no reward source", "dataset required", "max_steps", "dict without dataset"])
def test_construction_errors(tmp_path, case):
    """What TRL refuses at construction, ours refuses with TRL's message."""

    class Guess:
        def reset(self, **kwargs) -> str:
            return "Guess the 5-letter word."

    kwargs = {
        "no reward source": dict(train_dataset=zen()),
        "dataset required": dict(reward_funcs=reward_model()),
        "max_steps": dict(environment_factory=Guess, reward_funcs=_lengths),
        "dict without dataset": dict(environment_factory={"a": Guess, "b": Guess}, reward_funcs=_lengths),
    }[case]
    config = dict(per_device_train_batch_size=3, num_generations=3)
    if case == "dict without dataset":
        config["max_steps"] = 1
    errors = {f: run(f, tmp_path, None, train=False, config=config, **kwargs).error for f in GRPO_FLAVOURS}
    assert errors["trl"] is not None and errors["trl"].startswith("ValueError")
    assert errors["ours"] == errors["trl"] and errors["ours+config"] == errors["trl"], errors


def test_train_with_environment_owned_data(tmp_path):
    """reset() writes the prompt, no tools, no dataset: TRL trains on the completions' lengths."""

    class Guess:
        def reset(self, **kwargs) -> str:
            return "Guess the 5-letter word."

    texts = ["Done!<|im_end|>", "DoneDone!<|im_end|>", "DoneDoneDone!<|im_end|>"]
    config = dict(learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_steps=2,
                  max_completion_length=8)
    runs = {}
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, lambda i, rows: texts[:rows], config=config, reward_funcs=_lengths,
                environment_factory=Guess)
        runs[flavour] = r
        assert r.error is None, (flavour, r.error)
        assert r.last("train_loss") is not None and r.params_changed, flavour
        assert not any(key.startswith("tools/") for entry in r.logs for key in entry), flavour  # no tools, no metrics
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_train_with_malformed_tool_calls(tmp_path):
    """Three calls the response template cannot read: no tool runs and no row is generated again."""
    first = ['<tool_call>\n{"arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>',
             '<toolcall>\n{"arguments": {"a": 3, "b": 4}}\n</toolcall><|im_end|>',
             '<tool_call>\n{"arguments": {a: 3, b: 4}}\n</tool_call><|im_end|>']

    def script(i, rows):
        assert rows == 3, "a malformed call must not be answered"
        return first

    config = dict(learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_completion_length=128,
                  max_steps=2)
    runs = {}
    for flavour in FLAVOURS:
        r = run(flavour, tmp_path, script, config=config, reward_funcs=reward_model(), train_dataset=zen(),
                tools=[multiply_tool])
        runs[flavour] = r
        assert r.error is None, (flavour, r.error)
        assert r.calls == [3, 3] and r.params_changed, flavour
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])


def test_qwen3_renders_with_trls_training_template(tmp_path):
    """Qwen3's chat template is not prefix-preserving: TRL swaps in its training variant for tool rollouts; the same
    prompts, tool messages and figures come out of ours."""
    seen = {}

    def reward(prompts, completions, completion_ids, **kwargs):
        seen[flavour] = completion_ids
        return [float(len(ids)) for ids in completion_ids]

    script = by_rows([call("multiply_tool", a=2, b=5) + "<|im_end|>", "No.<|im_end|>"], ["Ten.<|im_end|>"])
    config = dict(per_device_train_batch_size=2, num_generations=2, max_completion_length=128, max_steps=1,
                  chat_template_kwargs={"enable_thinking": False})
    runs = {}
    for flavour in GRPO_FLAVOURS:
        runs[flavour] = run(flavour, tmp_path, script, model=policy("qwen3"), config=config, reward_funcs=reward,
                            train_dataset=zen(), tools=[multiply_tool])
    assert seen["ours"] == seen["trl"] == seen["ours+config"]
    for flavour in ("ours", "ours+config"):
        same_figures(runs["trl"], runs[flavour])
