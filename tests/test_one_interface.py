"""One interface across the workflow (issue 58): a TRL user's ``environment_factory`` class, as TRL's docs write one,
goes through SFT, GRPO, ``evaluate`` and rendering with no wrapper; every entry point takes the trainers' rollout
arguments under the same names and refuses one given under the wrong name in one line that names the right one; SFT
rows carry the prompt ids RL samples from, for every convention."""

from __future__ import annotations

import os

import pytest
from conventions import CONVENTIONS, build_convention
from helpers import native_call, scripted

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

DEFINITIONS = {"wen": "a small cyst", "gry": "a unit of measure", "fub": "to cheat"}


class Dictionary:
    """A TRL environment class, as TRL's docs write one: reset(**row), tool methods with docstrings, no step()."""

    def reset(self, word: str, **kwargs) -> str:
        self.word = word
        return " Look it up first."

    def define(self, word: str) -> str:
        """Look up the definition of a word.

        Args:
            word: The word to look up.
        """
        return DEFINITIONS.get(word, "unknown word")


def defined(completions, word, **kwargs):
    """1 when the last message gives the row's definition."""
    return [float(DEFINITIONS[w] in (c[-1]["content"] or "")) for c, w in zip(completions, word)]


def rows(words=("wen", "gry", "fub", "wen")):
    return [{"prompt": [{"role": "user", "content": f"Define {w}."}], "word": w} for w in words]


def demonstration(word: str) -> dict:
    call = {"type": "function", "function": {"name": "define", "arguments": {"word": word}}}
    return {**rows([word])[0], "completion": [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "define", "content": DEFINITIONS[word]},
        {"role": "assistant", "content": f"{word}: {DEFINITIONS[word]}."}]}


@pytest.fixture(scope="module")
def qwen():
    return build_convention("qwen2.5-instruct")


def _grpo_args(tmp_path, **extra):
    from trl import GRPOConfig

    values = dict(output_dir=str(tmp_path / "grpo"), per_device_train_batch_size=4, num_generations=2,
                  max_completion_length=96, max_steps=2, learning_rate=1e-3, report_to="none", use_cpu=True,
                  bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return GRPOConfig(**{**values, **extra})


def test_an_environment_factory_class_goes_through_sft_grpo_evaluate_and_render(qwen, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from trl_agentic import AgenticGRPOTrainer
    from trl_agentic.evaluate import evaluate
    from trl_agentic.render import render_html
    from trl_agentic.sft import sft_dataset

    tok, model = qwen.load_tokenizer(), qwen.load_model()
    # 1. SFT on demonstrations, replayed against the class: its tools' schemas and reset() text in the prompt
    data = sft_dataset([demonstration(w) for w in DEFINITIONS], tok, environment_factory=Dictionary,
                       generation_config=qwen.generation_config, show_progress=False, max_completion_length=256)
    text = tok.decode(data[0]["input_ids"])
    assert '"name": "define"' in text and "Define wen. Look it up first." in text
    sft = SFTTrainer(model=model, train_dataset=data, processing_class=tok,
                     args=SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=3,
                                    report_to="none", use_cpu=True, bf16=False, save_strategy="no"))
    sft.train()
    # 2. GRPO with the same class and reward function, TRL's config
    trainer = AgenticGRPOTrainer(model=model, processing_class=tok, reward_funcs=defined, args=_grpo_args(tmp_path),
                                 train_dataset=Dataset.from_list(rows()), environment_factory=Dictionary)
    trainer.train()
    assert trainer.state.global_step == 2
    # 3. evaluate with the same arguments (the model scripted to call the tool, then answer)
    scripted(model, tok, [native_call("define", word="gry"), "gry: a unit of measure."])
    report, trajectories = evaluate(model, tok, rows=rows(["gry", "wen"]), reward_funcs=defined,
                                    environment_factory=Dictionary, show_progress=False, max_completion_length=128)
    assert report.accuracy == 0.5 and report.mean_tool_calls == 1.0 and report.reward_means == {"defined": 0.5}
    assert trajectories[0].messages[1] == {"role": "tool", "name": "define", "content": "a unit of measure"}
    # 4. render what evaluate returned: the call and its result under each turn
    page = render_html(trajectories, tok, extras=[{"reward": r} for r in report.rewards])
    assert "define" in page and "a unit of measure" in page and "could not be rendered" not in page


def test_evaluate_scores_with_get_reward_and_weighted_functions_as_the_trainers_do(qwen):
    """A class's ``get_reward`` is a reward function of weight 1 after the user's, as TRL adds it in training."""
    from trl_agentic.evaluate import evaluate

    class Scored(Dictionary):
        def get_reward(self) -> float:
            return 0.5

    tok, model = qwen.load_tokenizer(), scripted(qwen.load_model(), qwen.load_tokenizer(),
                                                 [native_call("define", word="wen"), "wen: a small cyst."])
    report, _ = evaluate(model, tok, rows=rows(["wen", "gry"]), reward_funcs=[defined], reward_weights=[2.0],
                         environment_factory=Scored, show_progress=False, max_completion_length=128,
                         success_threshold=2.5)
    assert report.rewards == [2.5, 0.5] and report.reward_means == {"defined": 0.5, "Scored": 0.5}
    assert report.accuracy == 0.5
    only_get_reward, _ = evaluate(model, tok, rows=rows(["wen"]), environment_factory=Scored, show_progress=False,
                                  max_completion_length=128, success_threshold=0.5)
    assert only_get_reward.rewards == [0.5]


async def an_agent(client, prompt, **row):
    return "done"


def a_tool(word: str) -> str:
    """Look up a word.

    Args:
        word: The word.
    """
    return word


def _lookup():
    from trl_agentic.toy import LookupEnvironment

    return LookupEnvironment


WRONG_KINDS = [
    ({"environment": Dictionary}, "pass environment_factory=Dictionary"),
    ({"environment": {"dict": Dictionary}}, "pass environment_factory={...}"),
    ({"environment": [a_tool]}, "pass tools=[...]"),
    ({"environment": an_agent}, "pass agent=an_agent"),
    ({"environment": a_tool}, "pass tools=[a_tool]"),
    ({"environment_factory": "lookup"}, "pass environment=LookupEnvironment"),
    ({"environment_factory": [a_tool]}, "pass tools=[...]"),
    ({"environment_factory": an_agent}, "pass agent=an_agent"),
    ({"tools": Dictionary}, "pass environment_factory=Dictionary"),
    ({"tools": a_tool}, "pass tools=[a_tool] (a list"),
    ({"tools": ["lookup"]}, "pass environment=LookupEnvironment"),
    ({"agent": Dictionary}, "pass environment_factory=Dictionary"),
    ({"agent": "lookup"}, "pass environment=LookupEnvironment"),
]


def _resolve(given):
    def one(value):
        return _lookup() if value == "lookup" else value

    return {k: [one(v) for v in value] if isinstance(value, list) else one(value) for k, value in given.items()}


@pytest.mark.parametrize("entry", ["trainer", "evaluate", "run_rollouts", "sft_dataset"])
@pytest.mark.parametrize("given,fix", WRONG_KINDS, ids=[f"{next(iter(g))}-{i}" for i, (g, _) in enumerate(WRONG_KINDS)])
def test_a_wrong_kind_is_refused_in_one_line_naming_the_right_argument(qwen, tmp_path, entry, given, fix):
    from datasets import Dataset

    from trl_agentic import AgenticGRPOTrainer, run_rollouts
    from trl_agentic.evaluate import evaluate
    from trl_agentic.sft import sft_dataset

    given = _resolve(given)
    calls = {
        "trainer": lambda: AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=defined, args=_grpo_args(tmp_path),
                                              train_dataset=Dataset.from_list(rows()), **given),
        "evaluate": lambda: evaluate(None, qwen.tokenizer, rows=rows(), reward_funcs=defined, **given),
        "run_rollouts": lambda: run_rollouts(None, qwen.tokenizer, rows=rows(), **given),
        "sft_dataset": lambda: sft_dataset([demonstration("wen")], qwen.tokenizer, show_progress=False, **given),
    }
    with pytest.raises(TypeError) as raised:
        calls[entry]()
    message = str(raised.value)
    assert fix in message and "\n" not in message, message


@pytest.mark.parametrize("entry", ["evaluate", "run_rollouts"])
def test_nothing_to_roll_out_names_the_four_arguments(qwen, entry):
    from trl_agentic import run_rollouts
    from trl_agentic.evaluate import evaluate

    call = evaluate if entry == "evaluate" else run_rollouts
    with pytest.raises(TypeError, match=r"needs something to roll out: pass environment= .*environment_factory= .*"
                                        r"tools= .*agent="):
        call(None, qwen.tokenizer, rows=rows(), **({"reward_funcs": defined} if entry == "evaluate" else {}))


def test_the_checks_of_the_trainers_run_on_evaluates_rows(qwen):
    """The rows and reward functions are checked as the trainers check train_dataset and reward_funcs."""
    from trl_agentic.evaluate import evaluate

    class NeedsColumn(Dictionary):
        def reset(self, word: str, level: int, **kwargs) -> None:
            self.word = word

    with pytest.raises(ValueError, match=r"NeedsColumn.reset\(\) needs level, which no dataset column provides"):
        evaluate(None, qwen.tokenizer, rows=rows(), reward_funcs=defined, environment_factory=NeedsColumn)

    def strict(completions, word):
        return [0.0]

    with pytest.raises(TypeError, match="reward function 'strict' does not accept"):
        evaluate(None, qwen.tokenizer, rows=rows(), reward_funcs=strict, environment_factory=Dictionary)


def test_a_dataset_without_prompt_is_said_once_under_environment_factory(qwen, tmp_path):
    """TRL trains such a dataset on one empty user message, silently; ours trains it too, and says so."""
    from datasets import Dataset

    from trl_agentic import AgenticGRPOTrainer

    data = Dataset.from_list([{"word": w} for w in ("wen", "gry", "fub", "wen")])
    with pytest.warns(UserWarning, match="train_dataset has no 'prompt' column .* empty user message"):
        AgenticGRPOTrainer(model=qwen.model_dir, reward_funcs=defined, args=_grpo_args(tmp_path), train_dataset=data,
                           environment_factory=Dictionary)


# -- the prompt ids of an SFT row are those of the RL rollout of the same row, for every convention ----------------
class Counter:
    """TRL's environment class with a reset text (added to the prompt, as TRL does) and one tool."""

    def reset(self, target: int, **kwargs) -> str:
        self.count = 0
        return f" Reach {target}."

    def increment(self, step: int) -> int:
        """Increment the counter.

        Args:
            step: The amount to add.
        """
        self.count += step
        return self.count


def _chat_environment():
    from trl_agentic import Environment, StepResult

    class Echo(Environment):
        def reset(self, target: int, **kwargs) -> None:
            self.target = target

        def step(self, action: str) -> StepResult:
            return StepResult(terminated=True)

    return Echo


@pytest.mark.parametrize("name", CONVENTIONS)
def test_sft_rows_have_the_prompt_ids_rl_samples_from(name, tmp_path):
    from datasets import Dataset

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.sft import sft_dataset

    conv = build_convention(name)
    row = {"prompt": [{"role": "user", "content": "Count to 3."}], "target": 3}
    if conv.name.startswith("gemma"):  # no tool support in Gemma's template: our environment, chat rollouts
        rollout = {"environment": _chat_environment()}
        settings = dict(rollout_mode="chat", observation_role=conv.observation_role)
        completion = [{"role": "assistant", "content": "3"}]
    else:
        rollout = {"environment_factory": Counter}
        settings = {}
        call = {"type": "function", "function": {"name": "increment", "arguments": {"step": 3}}}
        completion = [{"role": "assistant", "content": "", "tool_calls": [call]},
                      {"role": "tool", "name": "increment", "content": "3"},
                      {"role": "assistant", "content": "Done."}]
    args = AgenticGRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                             max_completion_length=128, max_steps=1, report_to="none", use_cpu=True, bf16=False,
                             **settings)
    trainer = AgenticGRPOTrainer(model=conv.model_dir, processing_class=conv.load_tokenizer(),
                                 reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                                 train_dataset=Dataset.from_list([row] * 2), **rollout)
    rl_prompt_ids = trainer.rollout_seam.run([row])[0][0].prompt_ids
    data = sft_dataset([{**row, "completion": completion}], conv.load_tokenizer(), show_progress=False,
                       generation_config=conv.generation_config, max_completion_length=128, **settings, **rollout)
    ids, labels = data[0]["input_ids"], data[0]["labels"]
    first_trained = next(i for i, label in enumerate(labels) if label != -100)
    assert ids[:first_trained] == rl_prompt_ids, conv.tokenizer.decode(ids[:first_trained])
