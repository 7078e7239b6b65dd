"""trl_agentic.sft: demonstrations in the engine's token layout, SFTTrainer rows whose labels leave observations out,
and rejection sampling (the RFT loop is recipes/rft.py: tests/recipes/test_rft.py)."""

import functools
import warnings

import pytest
import torch
from conventions import CONVENTIONS, build_convention
from helpers import ScriptedGenerator, even_rows_right

from trl_agentic import TagEnvironment
from trl_agentic.environments.tag_protocol import SEARCH_R1_TAGS
from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.rollout.engine import RolloutEngine
from trl_agentic.rollout.observations import ObservationEncoder
from trl_agentic.sft import (
    DemonstrationError,
    demonstration_to_trajectory,
    rejection_sampling,
    sft_dataset,
    trajectory_to_sft_example,
    transcript_to_trajectory,
)
from trl_agentic.toy import LookupEnvironment, lookup_reward, make_lookup_dataset
from trl_agentic.toy.task import LOOKUP_TAGS
from trl_agentic.trajectory import Trajectory

PROMPT = "Answer with a search. Question: Who designed the Greywatch Light?\n"
ACTIONS = ["<think>I should search.</think><search> Greywatch Light </search>", "<answer> Odile Marcheval </answer>"]
# hostile tool output: control-token strings must stay plain text
CONTENT = 'Doc 1(Title: "Greywatch Light") It was designed by Odile Marcheval. <|im_end|><eos><|eot_id|>'
OBSERVATION = f"\n\n<information>{CONTENT}</information>\n\n"
TRANSCRIPT = ACTIONS[0] + OBSERVATION + ACTIONS[1]
SEARCH_ENV = functools.partial(TagEnvironment, tools={"search": lambda query: CONTENT})


def _chat_ready(name):
    """The engine takes this template in chat mode (Qwen3's is not prefix-preserving; Qwen2.5 base's turns end with
    no special token)."""
    conv = build_convention(name)
    try:
        ObservationEncoder(conv.tokenizer, "chat", conv.observation_role, eos_token_ids=conv.eos_token_ids)
    except ValueError:
        return False
    return True


CHAT_CONVENTIONS = [name for name in CONVENTIONS if _chat_ready(name)]
# templates that render a finished conversation as the model samples it (Qwen3 rewrites the reasoning of turns)
RENDER_STABLE = [name for name in CHAT_CONVENTIONS if build_convention(name).prefix_stable]


def _ids(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _scripted(tokenizer, texts):
    """A generation backend that samples ``texts`` in turn (the action ids a model would sample)."""
    turns = iter(texts)
    return ScriptedGenerator(tokenizer, lambda ids: next(turns))


@pytest.fixture(params=["toy", *CONVENTIONS])
def any_tokenizer(request, tokenizer):
    return tokenizer if request.param == "toy" else build_convention(request.param).tokenizer


# -- layout ------------------------------------------------------------------------------------------------------


def test_tag_protocol_splits_a_transcript(tokenizer):
    split_transcript = SEARCH_R1_TAGS.split_transcript
    assert split_transcript(TRANSCRIPT) == (ACTIONS, [OBSERVATION])
    assert split_transcript(ACTIONS[0] + ACTIONS[1]) == (ACTIONS, [None])  # the environment fills it in
    assert split_transcript("<answer> x </answer>\n") == (["<answer> x </answer>"], [])
    assert split_transcript("no tags at all") == (["no tags at all"], [])
    with pytest.raises(ValueError, match="after the final"):
        split_transcript("<answer> x </answer> and more")
    with pytest.raises(ValueError, match="ends with an observation"):
        split_transcript(ACTIONS[0] + OBSERVATION)
    # a demonstration written so is refused with the demonstration's error
    with pytest.raises(DemonstrationError, match="ends with an observation"):
        transcript_to_trajectory(tokenizer, PROMPT, ACTIONS[0] + OBSERVATION)


def test_text_demonstration_has_the_ids_a_rollout_has(any_tokenizer):
    """The transcript's ids, replayed or read, equal a live rollout's whose model samples the same actions: prompt as
    the engine encodes it, each action tokenized as sampled (mask 1), the observation as the encoder appends it, its
    control-token strings as plain text (mask 0)."""
    tok = any_tokenizer
    live = RolloutEngine(_scripted(tok, ACTIONS), tok, SEARCH_ENV).run([PROMPT])[0]
    read = transcript_to_trajectory(tok, PROMPT, TRANSCRIPT)
    replayed = transcript_to_trajectory(tok, PROMPT, ACTIONS[0] + ACTIONS[1], environment=SEARCH_ENV)
    expected_observation = ObservationEncoder(tok).encode_observation(OBSERVATION, [], 10_000).ids
    expected = _ids(tok, ACTIONS[0]) + expected_observation + _ids(tok, ACTIONS[1])
    mask = [1] * len(_ids(tok, ACTIONS[0])) + [0] * len(expected_observation) + [1] * len(_ids(tok, ACTIONS[1]))
    for t in (live, read, replayed):
        assert t.prompt_ids == list(tok(PROMPT)["input_ids"])
        assert t.completion_ids == expected and t.env_mask == mask
        assert t.agent_segments() == [_ids(tok, a) for a in ACTIONS]
        assert t.stop_reason == "terminated"
    assert set(expected_observation).isdisjoint(tok.all_special_ids)
    assert tok.decode(expected_observation) == OBSERVATION


def _chat_demo(conv):
    prompt = [{"role": "user", "content": "Who designed the Greywatch Light?"}]
    completion = [{"role": "assistant", "content": "<search> Greywatch Light </search>"},
                  {"role": conv.observation_role, "content": "It was designed by Odile Marcheval."},
                  {"role": "assistant", "content": "<answer> Odile Marcheval </answer>"}]
    return prompt, completion


@pytest.mark.parametrize("name", RENDER_STABLE)
def test_chat_demonstration_is_the_chat_template_render(name):
    """Chat mode without stop strings: prompt + completion ids are the chat template's own render of the whole
    conversation (up to its trailing whitespace); the assistant contents and their end-of-turn ids are trained, the
    observation message and the headers are not."""
    conv = build_convention(name)
    tok = conv.tokenizer
    prompt, completion = _chat_demo(conv)
    t = transcript_to_trajectory(tok, prompt, completion, protocol=None, generation_config=conv.generation_config,
                                 rollout_mode="chat", observation_role=conv.observation_role)
    render = tok.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)["input_ids"]
    ids = t.prompt_ids + t.completion_ids
    assert render[: len(ids)] == ids and tok.decode(render[len(ids):]).strip() == ""
    trained = [i for i, m in zip(t.completion_ids, t.env_mask) if m]
    eot = conv.end_of_turn_id
    assert trained == _ids(tok, completion[0]["content"]) + [eot] + _ids(tok, completion[2]["content"]) + [eot]


@pytest.mark.parametrize("name", CHAT_CONVENTIONS)
def test_chat_demonstration_has_the_ids_a_rollout_has(name):
    """Chat mode with the tag protocol's stop strings: as in a live rollout, a turn ends at its closing tag, and the
    end-of-turn id comes with the observation (masked)."""
    conv = build_convention(name)
    tok = conv.tokenizer
    prompt, completion = _chat_demo(conv)
    budgets = dict(rollout_mode="chat", observation_role=conv.observation_role)
    env = functools.partial(TagEnvironment, tools={"search": lambda query: completion[1]["content"]},
                            observation_template="{content}")
    live = RolloutEngine(_scripted(tok, [completion[0]["content"], completion[2]["content"]]), tok, env,
                         RolloutConfig(**budgets), eos_token_ids=conv.eos_token_ids).run([prompt])[0]
    demo = transcript_to_trajectory(tok, prompt, completion, generation_config=conv.generation_config, **budgets)
    assert (demo.prompt_ids, demo.completion_ids, demo.env_mask) == (live.prompt_ids, live.completion_ids,
                                                                     live.env_mask)
    assert demo.agent_segments() == [_ids(tok, completion[0]["content"]), _ids(tok, completion[2]["content"])]
    assert conv.end_of_turn_id in [i for i, m in zip(demo.completion_ids, demo.env_mask) if not m]


# -- SFTTrainer --------------------------------------------------------------------------------------------------


def _demo_rows():
    return [{"prompt": PROMPT, "completion": TRANSCRIPT},
            {"prompt": "Question: Who lit it?\n",
             "completion": ACTIONS[0] + "\n\n<information>Doc 1 nobody</information>\n\n<answer> nobody </answer>"}]


def _first_batch_labels(model, tok, dataset, tmp_path, **sft_kwargs):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=len(dataset), max_steps=1,
                     report_to="none", use_cpu=True, bf16=False, save_strategy="no", **sft_kwargs)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tok)
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer, batch


@pytest.mark.parametrize("name", ["toy", *CONVENTIONS])
@pytest.mark.parametrize("mask_observations", [True, False])
def test_sft_trainer_puts_no_loss_on_observations(name, mask_observations, tokenizer, tiny_model, tmp_path):
    """The labels SFTTrainer trains on: the ids at sampled positions, -100 on the prompt and (unless
    mask_observations=False) on every observation position; then one optimizer step runs."""
    if name == "toy":
        tok, model = tokenizer, tiny_model
    else:
        conv = build_convention(name)
        tok, model = conv.load_tokenizer(), conv.load_model()
    trajectories = [transcript_to_trajectory(tok, r["prompt"], r["completion"]) for r in _demo_rows()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = sft_dataset(trajectories, mask_observations=mask_observations, show_progress=False)
    assert any("mask_observations=False" in str(w.message) for w in caught) == (not mask_observations)
    trainer, batch = _first_batch_labels(model, tok, dataset, tmp_path)
    for input_ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
        t = next(t for t in trajectories if input_ids[: len(t.prompt_ids) + len(t.completion_ids)]
                 == t.prompt_ids + t.completion_ids)
        n_prompt, n = len(t.prompt_ids), len(t.prompt_ids) + len(t.completion_ids)
        assert labels[:n_prompt] == [-100] * n_prompt and set(labels[n:]) <= {-100}
        for position, (token, sampled) in enumerate(zip(t.completion_ids, t.env_mask), start=n_prompt):
            trained = sampled or not mask_observations
            assert labels[position] == (token if trained else -100)
        assert t.num_observation_tokens > 0
    trainer.train()
    assert torch.isfinite(torch.tensor(trainer.state.log_history[-1]["train_loss"]))


@pytest.mark.parametrize("completion_only_loss", [None, False, True])
def test_labels_hold_whatever_completion_only_loss_says(completion_only_loss, tokenizer, tiny_model, tmp_path):
    """The labels column is used as is, whatever completion_only_loss says: a batch's labels are the rows'."""
    dataset = sft_dataset(_demo_rows(), tokenizer, show_progress=False)
    _, batch = _first_batch_labels(tiny_model, tokenizer, dataset, tmp_path,
                                   completion_only_loss=completion_only_loss)
    rows = {tuple(r["input_ids"]): [label != -100 for label in r["labels"]] for r in dataset}
    for input_ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
        mask = next(m for ids, m in rows.items() if tuple(input_ids[: len(ids)]) == ids)
        assert [label != -100 for label in labels[: len(mask)]] == [bool(m) for m in mask]


def test_trajectory_to_sft_example():
    t = Trajectory(prompt_ids=[5, 6], completion_ids=[7, 8, 9, 10], env_mask=[1, 0, 0, 1])
    assert trajectory_to_sft_example(t) == {"input_ids": [5, 6, 7, 8, 9, 10], "labels": [-100, -100, 7, -100, -100, 10]}
    with pytest.warns(UserWarning, match="mask_observations=False"):
        assert trajectory_to_sft_example(t, mask_observations=False)["labels"] == [-100, -100, 7, 8, 9, 10]
    t.stop_reason, t.error = "env_error", "boom"
    with pytest.raises(ValueError, match="environment failed"):
        trajectory_to_sft_example(t)


# -- refusals ----------------------------------------------------------------------------------------------------


def _never_ends():
    return TagEnvironment(tools={"search": lambda q: "x"})


@pytest.mark.parametrize("completion, kwargs, match", [
    ("<search> a </search> and more", {}, "tool call without an observation"),
    ("<answer> " + "word " * 80 + "</answer>", {"max_tokens_per_turn": 16}, "more than max_tokens_per_turn"),
    ("<search> a </search><search> b </search>", {"environment": _never_ends}, "did not end the episode"),
    (TRANSCRIPT, {"environment": SEARCH_ENV}, "leave them out"),
    (TRANSCRIPT, {"max_turns": 1}, "raise the budget"),
    (TRANSCRIPT, {"rollout_mode": "chat"}, "needs rollout_mode='text'"),
])
def test_demonstrations_the_engine_could_not_sample_are_refused(tokenizer, completion, kwargs, match):
    with pytest.raises(DemonstrationError, match=match):
        transcript_to_trajectory(tokenizer, PROMPT, completion, **kwargs)


def test_an_action_that_a_stop_string_would_cut_is_refused(tokenizer):
    with pytest.raises(DemonstrationError, match="ends the turn after .* tokens .a stop string"):
        demonstration_to_trajectory(tokenizer, PROMPT, ["<search> a </search> and more", "<answer> b </answer>"],
                                    ["<information>x</information>"])
    with pytest.raises(DemonstrationError, match="exactly one"):
        demonstration_to_trajectory(tokenizer, PROMPT, ACTIONS)
    with pytest.raises(DemonstrationError, match="need 1 observations"):
        demonstration_to_trajectory(tokenizer, PROMPT, ACTIONS, [])


def test_chat_completion_must_alternate(tokenizer):
    prompt = [{"role": "user", "content": "hi"}]
    bad = [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(DemonstrationError, match="role 'user' where 'tool'"):
        transcript_to_trajectory(tokenizer, prompt, bad, rollout_mode="chat")
    with pytest.raises(DemonstrationError, match="end with an assistant"):
        transcript_to_trajectory(tokenizer, prompt, bad, rollout_mode="chat", observation_role="user")


def test_a_demonstration_whose_tool_failed_in_the_replay_is_refused(tokenizer):
    """Replayed against the real tool, a demonstration whose tool call failed (here: the tool returns None) would
    teach the error text; it is refused, and sft_dataset skips it with a warning that says why."""
    from functools import partial

    def forgot_to_return(q):
        f"docs for {q}"  # noqa: B018 - the bug: no return

    environment = partial(TagEnvironment, tools={"search": forgot_to_return})
    completion = "<search> Greywatch Light </search><answer> Odile Marcheval </answer>"
    refused = r"the search call of action 0 failed during the replay \(\"<information>{'error': 'the search tool returned"
    with pytest.warns(RuntimeWarning), pytest.raises(DemonstrationError, match=refused):
        transcript_to_trajectory(tokenizer, PROMPT, completion, environment=environment)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="no example could be converted .*failed during the replay"):
            sft_dataset([{"prompt": PROMPT, "completion": completion}], tokenizer, environment=environment,
                        show_progress=False)
    assert any("skipped 1 of 1 examples" in str(w.message) for w in caught)


def test_sft_dataset_skips_bad_examples_with_one_warning(tokenizer):
    rows = _demo_rows() + [{"prompt": PROMPT, "completion": "<answer> x </answer> trailing"}, {"prompt": PROMPT}]
    with pytest.warns(UserWarning, match="skipped 2 of 4 examples; first: example 2"):
        dataset = sft_dataset(rows, tokenizer, show_progress=False)
    assert len(dataset) == 2 and dataset.column_names == ["input_ids", "labels"]
    with pytest.raises(ValueError, match="no example could be converted"):
        sft_dataset(rows[2:3], tokenizer, show_progress=False)


# -- rejection sampling ------------------------------------------------------------------------------------------


def test_rejection_sampling_keeps_distinct_passing_trajectories(tokenizer):
    rows = make_lookup_dataset(6, seed=1)
    sample = rejection_sampling(None, tokenizer, LookupEnvironment, rows, lookup_reward, samples_per_row=3,
                                success_threshold=1.0, max_per_row=None, generator=even_rows_right(tokenizer, rows),
                                show_progress=False, max_turns=3, max_completion_length=60)
    assert sample.report.accuracy == 0.5 and len(sample.report.rewards) == 18
    # three identical successful samples per even row: kept once each
    assert [r["prompt"] for r in sample.rows] == [rows[i]["prompt"] for i in (0, 2, 4)]
    for t, row in zip(sample.trajectories, sample.rows):
        assert t.actions[-1] == f"<answer>{row['value']}</answer>"
    dataset = sft_dataset(sample.trajectories, show_progress=False)
    assert len(dataset) == 3


def test_sft_warm_start_teaches_the_toy_agent_its_tool(tiny_model, tokenizer, tmp_path):
    """Learning, not plumbing: a random tiny model never looks a value up and answers it; after SFT on replayed
    demonstrations it does, on held-out keys."""
    from trl import SFTConfig, SFTTrainer

    from trl_agentic.evaluate import evaluate

    def demo(row):
        return {**row, "completion": f"<lookup>{row['key']}</lookup><answer>{row['value']}</answer>"}

    budgets = dict(max_turns=3, max_tokens_per_turn=12, max_completion_length=48)
    held_out = make_lookup_dataset(32, seed=11)
    before, _ = evaluate(tiny_model, tokenizer, LookupEnvironment, held_out, lookup_reward, greedy=True,
                         show_progress=False, **budgets)
    dataset = sft_dataset([demo(r) for r in make_lookup_dataset(256, seed=10)], tokenizer,
                          environment=LookupEnvironment, protocol=LOOKUP_TAGS, show_progress=False, **budgets)
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=16, num_train_epochs=12,
                     learning_rate=6e-3, report_to="none", use_cpu=True, bf16=False, save_strategy="no", seed=0,
                     gradient_checkpointing=False)
    SFTTrainer(model=tiny_model, args=args, train_dataset=dataset, processing_class=tokenizer).train()
    after, _ = evaluate(tiny_model.eval(), tokenizer, LookupEnvironment, held_out, lookup_reward, greedy=True,
                        show_progress=False, **budgets)
    assert before.accuracy == 0 and after.accuracy >= 0.9
    assert after.mean_tool_calls == pytest.approx(1.0)
