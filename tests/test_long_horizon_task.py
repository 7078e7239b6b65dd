"""benchmarks/long_horizon/walk.py, the long-horizon task (issue 59): the generators, the walk's rules, the outcome
and the per-turn signal, TRL's environment_factory contract, and the task through our engine and run.py's stages
on a tiny model."""

import json

import pytest
from helpers import native_call, scripted

from benchmarks.learning_native import model as native_model
from benchmarks.learning_native import run
from benchmarks.long_horizon import speed, walk


def _row(start, item, goal, story="key", item_order="xy", goal_order="xy"):
    return {"question": "q", "story": story, "start": list(start), "item": list(item), "goal": list(goal),
            "item_order": item_order, "goal_order": goal_order, "golden_answers": [f"({goal[0]}, {goal[1]})"]}


def _walked(row, steps):
    environment = walk.WalkEnvironment()
    environment.reset(**row)
    return environment, [getattr(environment, step)() for step in steps]


# -- the generators ----------------------------------------------------------------------------------------------


def test_sets_are_drawn_from_their_seed_and_held_out_worlds_are_not_trained_on():
    sets = walk.task_rows(300, 40, seed=0)
    assert sets == walk.task_rows(300, 40, seed=0)  # deterministic
    assert sets["test"] != walk.task_rows(300, 40, seed=1)["test"]  # each data seed its own sets
    trained = {walk.world_of(row) for row in sets["train"]}
    train, transfer = walk.GENERATORS["train"], walk.GENERATORS["transfer"]
    for name, generator in (("train", train), ("test", train), ("transfer", transfer)):
        assert {row["story"] for row in sets[name]} == set(generator.stories)
        for row in sets[name]:
            start, item, goal, *orders = walk.world_of(row)
            assert walk.distance(start, item) >= 2 and walk.distance(item, goal) >= 2 and set(orders) <= {"xy", "yx"}
            assert walk.MIN_MOVES <= len(walk.shortest_walk(row)) <= walk.MAX_MOVES
            assert row["golden_answers"] == [f"({goal[0]}, {goal[1]})"]
            way = generator.way(walk.offset(start, item), row["item_order"])
            assert row["question"].startswith(generator.opening.format(x=start[0], y=start[1])) and way in row["question"]
    assert not trained & {walk.world_of(row) for row in sets["test"] + sets["transfer"]}
    assert not set(train.stories) & set(transfer.stories)  # other stories, other wording
    assert train.opening != transfer.opening and train.position != transfer.position and train.part != transfer.part
    assert {row["item_order"] for row in sets["train"]} == {row["goal_order"] for row in sets["train"]} == {"xy", "yx"}


@pytest.mark.parametrize("generator, dx, dy, order, way", [
    ("train", 3, -1, "xy", "3 steps east and 1 step south"), ("train", 3, -1, "yx", "1 step south and 3 steps east"),
    ("train", 0, 2, "xy", "2 steps north"), ("transfer", -1, 2, "yx", "2 paces north, then 1 pace west")])
def test_a_way_names_its_parts_in_its_order(generator, dx, dy, order, way):
    assert walk.GENERATORS[generator].way((dx, dy), order) == way


# -- the walk, the outcome and the per-turn signal -----------------------------------------------------------------


def test_the_shortest_walk_succeeds_in_at_least_six_turns_and_scores_progress_at_every_step():
    for row in walk.task_rows(40, 20, seed=3)["test"]:
        steps = walk.shortest_walk(row)
        environment, observations = _walked(row, steps)
        assert environment.get_reward() == 1.0 and observations[-1].endswith(walk.DONE)
        assert environment._progress == [1.0] * len(steps)
        messages = walk.demonstration(row)
        assert len([m for m in messages if m["role"] == "assistant"]) >= 6  # the steps and the reply
        assert walk.walk_success([messages]) == [1.0]
        assert walk.walk_success([messages[:-2]]) == [0.0]  # one step short


def test_the_way_to_the_goal_is_only_told_once_on_the_item_and_the_goal_opens_only_with_it():
    row = _row((0, 0), (2, 0), (3, 2), goal_order="yx")
    environment, observations = _walked(row, ["north", "north", "east", "east", "east"])  # past the goal first
    assert observations[4] == "You are at (3, 2)." and environment.get_reward() == 0.0
    environment, observations = _walked(row, ["east", "east", "north", "north", "east"])
    assert observations[:2] == ["You are at (1, 0).", "You are at (2, 0). You pick up the key. It says: the door is "
                                                      "2 steps north and 1 step east of here."]
    assert observations[2:4] == ["You are at (2, 1).", "You are at (2, 2)."]  # the position alone
    assert observations[4] == f"You are at (3, 2). You open the door. {walk.DONE}" and environment.get_reward() == 1.0
    assert walk.shortest_walk(row) == ["east", "east", "north", "north", "east"]  # each way in its order
    transfer, said = _walked(_row((0, 0), (2, 0), (3, 2), story="map"), ["east", "east"])
    assert said[1] == "Now at (2, 0). You unfold the map. The treasure is buried 1 pace east, then 2 paces north from here."


def test_per_turn_signal_is_progress_toward_the_current_target_not_the_outcome():
    row = _row((0, 0), (2, 0), (2, 3))
    environment = walk.ShapedWalkEnvironment()
    environment.reset(**row)
    # away (-1), wall (0), back (+1), wall (0), on to the item (+1, +1: the pickup switches the target), toward the
    # goal (+1); the state each step led to
    observations, rewards, states = [], [], []
    for step in ["north", "west", "south", "south", "east", "east", "north"]:
        observations.append(getattr(environment, step)())
        rewards.append(environment._turn_reward())
        states.append(environment._state_key())
    assert observations[1] == "A wall. You are at (0, 1)." and observations[3] == "A wall. You are at (0, 0)."
    assert environment._progress == [-1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert rewards == [walk.SHAPING * p for p in environment._progress]
    assert states == ["0,1,0", "0,1,0", "0,0,0", "0,0,0", "1,0,0", "2,0,1", "2,1,1"]
    assert environment.get_reward() == 0.0  # progress, no outcome
    assert environment._turn_reward() == 0.0  # a turn without a step (the reply)
    environment.east(), environment.west()
    assert environment._turn_reward() == 0.0  # two steps in one turn: -1 + 1
    environment, _ = _walked(row, walk.shortest_walk(row) + ["west"])
    assert environment._progress[-1] == 0.0 and environment.get_reward() == 1.0  # a step after the end
    environment.reset(**row)
    assert (environment._progress, environment._state_key(), environment.get_reward()) == ([], "0,0,0", 0.0)
    assert not hasattr(walk.WalkEnvironment, "_turn_reward")  # outcome-only: its turns earn nothing else


def test_progress_metric_reads_the_environments():
    row = _row((0, 0), (2, 0), (2, 3))
    good, _ = _walked(row, walk.shortest_walk(row))
    bad, _ = _walked(row, ["north", "north"])
    assert walk.progress([[], [], []], environments=[good, bad, walk.WalkEnvironment()]) == [1.0, -1.0, 0.0]
    assert walk.progress([[]]) == [None]


# -- TRL's contract and our engine ---------------------------------------------------------------------------------


def test_trl_sees_four_tools_and_the_outcome_as_get_reward():
    from trl_agentic.environments.native_tools import check_tool_schema, tool_methods
    from trl_agentic.environments.trl_environments import TRLEnvironments

    for cls in (walk.WalkEnvironment, walk.ShapedWalkEnvironment):
        assert [m.__name__ for m in tool_methods(cls())] == ["east", "north", "south", "west"]
    environments = TRLEnvironments(environment_factory=walk.WalkEnvironment)
    assert [t.__name__ for t in environments.all_tools()] == ["east", "north", "south", "west"]
    for tool in environments.all_tools():
        check_tool_schema(tool)
    assert [f.__name__ for f in environments.reward_functions()] == ["WalkEnvironment"]


@pytest.fixture(scope="module")
def walk_model_dir(tmp_path_factory):
    """A tiny random Qwen2 with a toy ChatML tokenizer trained on the task's text, given SmolLM2's tool templates."""
    from trl_agentic.toy import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-walk")
    rows = walk.task_rows(40, 8, seed=0)
    text = [walk.INSTRUCTION, native_model.CHATML_TOOLS_TEMPLATE, walk.REPLY]
    for row in rows["train"] + rows["transfer"]:
        text += [row["question"], *(str(m.get("content")) for m in walk.demonstration(row))]
    text += [native_call(step) for step in walk.MOVES]
    tokenizer = native_model.with_tool_template(build_tokenizer(text, vocab_size=1000))
    build_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_the_shortest_walk_through_our_engine_is_scored_by_get_reward(walk_model_dir):
    """A tiny model forced to play the shortest walk of a held-out row, rolled out by our engine with TRL's
    environment_factory: the steps reach the environment, get_reward (the trainers' reward column) and the messages
    agree on the outcome, the per-turn signal is +1 at every step, and the walk takes at least six turns."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_agentic.environments.trl_environments import TRLEnvironments
    from trl_agentic.evaluate import evaluate

    tokenizer = AutoTokenizer.from_pretrained(walk_model_dir)
    task = run.WalkTask(run.make_parser().parse_args(["--task", "walk", "--train-size", "8", "--test-size", "1"]))
    row = task.test[0]
    steps = walk.shortest_walk(row)
    model = scripted(AutoModelForCausalLM.from_pretrained(walk_model_dir), tokenizer,
                     [native_call(step) for step in steps] + [walk.REPLY])
    environments = TRLEnvironments(environment_factory=walk.WalkEnvironment)
    budgets = dict(rollout_mode="chat", max_turns=10, max_tokens_per_turn=40, max_completion_length=800)
    seen = {}

    def outcome_and_signal(completions, environments, **kwargs):
        seen["rewards"] = [list(e._progress) for e in environments]
        return environments_reward(completions=completions, environments=environments, **kwargs)

    environments_reward = environments.reward_functions()[0]
    report, trajectories = evaluate(model, tokenizer, environments, task.rows([row]), outcome_and_signal, greedy=True,
                                    show_progress=False, **budgets)
    messages = trajectories[0].messages
    assert report.accuracy == 1.0 and walk.walk_success([messages]) == [1.0]
    assert [m["tool_calls"][0]["function"]["name"] for m in messages if m.get("tool_calls")] == steps
    assert report.mean_turns == len(steps) + 1 >= 6
    assert seen["rewards"] == [[1.0] * len(steps)]
    for m in messages:  # every model turn is short: a step call is 24 tokens with SmolLM2's tokenizer
        if m["role"] == "assistant" and m.get("tool_calls"):
            assert m["tool_calls"][0]["function"]["arguments"] == {}


def test_walk_stages_run_end_to_end_on_a_local_model(tmp_path, walk_model_dir):
    """``--task walk`` through ``main``: zero-shot, SFT on shortest-walk demonstrations, TRL's GRPOTrainer and
    AgenticGRPOTrainer with environment_factory (get_reward the trained reward), each scored on the held-out and
    transfer walks, the per-turn signal logged at each step."""
    out = tmp_path / "walk"
    argv = ["--task", "walk", "--model", walk_model_dir, "--out", str(out), "--train-size", "16", "--test-size", "2",
            "--eval-batch-size", "4", "--sft-demos", "4", "--sft-batch-size", "2", "--rl-steps", "1",
            "--rl-prompts-per-step", "2", "--num-generations", "2", "--max-completion-length", "600",
            "--max-tokens-per-turn", "24", "--max-turns", "9", "--lora-r", "2", "--eval-every", "0", "--threads", "1",
            "--ppo-advantage-mode", "turn", "--stages", "zero_shot,sft,trl_grpo,grpo,grpo_shaped,gigpo,ppo"]
    assert run.main(argv) == 0
    for stage in ("zero_shot", "sft", "trl_grpo", "grpo", "grpo_shaped", "gigpo", "ppo"):
        report = json.loads((out / stage / "report.json").read_text())
        assert {"em", "final_em", "transfer_em", "mean_calls", "mean_turns"} <= set(report), stage
    # each set's greedy walks are kept and replay in their worlds (failures.py), each split to its own score
    from benchmarks.long_horizon import failures

    for split, key in (("heldout", "em"), ("transfer", "transfer_em")):
        for name, counts in failures.failures([out], split).items():
            report = json.loads((tmp_path / name / "report.json").read_text())
            assert counts["walks"] == 2 and counts["arrived"] / 2 == report[key] == counts["em"], (split, name)
    sft = json.loads((out / "sft" / "report.json").read_text())
    assert sft["demonstrations"] == 4 and sft["trained_tokens"] > 0
    for stage in ("trl_grpo", "grpo", "grpo_shaped", "gigpo", "ppo"):
        report = json.loads((out / stage / "report.json").read_text())
        curves = report["curves"]
        # the shaped arm logs its summed turn rewards, GiGPO its anchored steps (the first turn's state is shared by
        # the group's two rollouts: a share > 0), the others neither
        assert (curves["shaping"][0] is not None) == (stage == "grpo_shaped"), stage
        assert (curves["anchored_step_share"][0] or 0) > 0 if stage == "gigpo" else curves["anchored_step_share"] == [None]
        assert curves["progress"][0] is not None and curves["turns"][0] is not None
        # where the step's time went, the same way for TRL's loop and ours: the loss's forward and backward inside it
        assert 0 < curves["forward_seconds"][0] and 0 < curves["backward_seconds"][0]
        assert curves["forward_seconds"][0] + curves["backward_seconds"][0] < curves["seconds"][0]
        assert report["forward_seconds_per_step"] == curves["forward_seconds"][0] and report["cpu_seconds_per_step"] > 0
    assert json.loads((out / "grpo" / "report.json").read_text())["curves"]["mask_audit"] == [0.0]
    assert json.loads((out / "ppo" / "report.json").read_text())["advantage_mode"] == "turn"
    # the speed comparison reads the two trainers' reports of the same run
    assert speed.main([str(out)]) == 0
    result = json.loads((out / "speed.json").read_text())
    assert result["ratio"] == result["grpo"]["seconds"] / result["trl_grpo"]["seconds"] > 0
    assert result["grpo"]["turns"] >= 1 and result["trl_grpo"]["steps"] == 1


def test_speed_split_takes_medians_and_names_the_missing_stage(tmp_path):
    curves = {"seconds": [10.0, 30.0, 20.0], "cpu_seconds": [9.0, 29.0, 19.0], "forward_seconds": [2.0, 4.0, 3.0],
              "backward_seconds": [4.0, 8.0, 6.0], "turns": [8.0, 7.0, 9.0]}
    assert speed.step_split(curves) == {"seconds": 20.0, "cpu_seconds": 19.0, "forward_seconds": 3.0,
                                        "backward_seconds": 6.0, "turns": 8.0, "rollout_seconds": 11.0, "steps": 3}
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "report.json").write_text(json.dumps({"curves": curves}))
    with pytest.raises(SystemExit, match="has no report of trl_grpo: run run.py --stages trl_grpo,grpo"):
        speed.main([str(tmp_path)])


def test_environment_of_each_stage():
    """The stages that read the per-turn signal get ``ShapedWalkEnvironment``; the outcome-only ones (GiGPO among
    them: its step returns are the outcome's alone) ``WalkEnvironment``; the shaped GRPO adds the turn rewards' sum
    with weight 1, the logged metrics keep weight 0; training is float32 unless ``--bf16``."""
    args = run.make_parser().parse_args(["--task", "walk", "--train-size", "4", "--test-size", "2"])
    task = run.make_task(args)
    factories = {name: run.environment_kwargs(task, args, name)["environment_factory"]
                 for name in ("trl_grpo", "grpo", "gigpo", "grpo_shaped", "ppo")}
    assert factories == {"trl_grpo": walk.WalkEnvironment, "grpo": walk.WalkEnvironment,
                         "gigpo": walk.WalkEnvironment, "grpo_shaped": walk.ShapedWalkEnvironment,
                         "ppo": walk.WalkEnvironment}
    args.ppo_advantage_mode = "turn"
    assert run.environment_kwargs(task, args, "ppo")["environment_factory"] is walk.ShapedWalkEnvironment
    shaped = run.reward_funcs(task, "grpo_shaped")
    assert [getattr(f, "__name__", "") for f in shaped][0] == "shaping"
    assert run.rl_config_values(task, args, "grpo_shaped")["reward_weights"] == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert run.rl_config_values(task, args, "grpo")["reward_weights"] == [0.0, 0.0, 0.0, 0.0]
    assert run.rl_config_values(task, args, "grpo")["bf16"] is False  # float32 unless --bf16
    args.bf16 = run.make_parser().parse_args(["--task", "walk", "--bf16"]).bf16
    assert run.rl_config_values(task, args, "gigpo")["bf16"] is True


@pytest.mark.parametrize("argv, message", [(["--interface", "tools"], "--task walk runs through environment_factory"),
                                           (["--transfer", "x"], "--task walk is always also scored"),
                                           (["--task", "arithmetic", "--stages", "grpo_shaped"], "pass --task walk")])
def test_walk_refuses_other_interfaces_before_loading_anything(tmp_path, argv, message):
    with pytest.raises(SystemExit, match=message):
        run.main(["--task", "walk", "--out", str(tmp_path), "--model", "no/such/model", *argv])


# -- failures.py: where a run's walks go wrong -------------------------------------------------------------------


def _call_messages(steps, reply=True):
    messages = []
    for step in steps:
        call = {"type": "function", "function": {"name": step, "arguments": {}}}
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "name": step, "content": "..."}]
    return messages + ([{"role": "assistant", "content": walk.REPLY}] if reply else [])


def test_failures_sorts_each_held_out_walk_by_its_first_wrong_step(tmp_path):
    """Each held-out walk of a run folder's stage, replayed in its world (drawn again from the report's command):
    arrived (even after a detour), first wrong step before or after the pickup, or stopped short; a run folder whose
    walks are not its command's is refused in one line."""
    from benchmarks.long_horizon import failures

    command = "python benchmarks/learning_native/run.py --task walk --train-size 40 --test-size 5 --data-seed 3"
    rows = walk.task_rows(40, 5, seed=3)["test"]
    back = {"north": "south", "south": "north", "east": "west", "west": "east"}
    walks = []
    for k, row in enumerate(rows):
        steps = walk.shortest_walk(row)
        to_item = walk.distance(row["start"], row["item"])
        if k == 1:  # a step back, then a reply: wrong on the way to the item, at call 1
            steps = [back[steps[0]]]
        elif k == 2:  # the item reached, then a step back: wrong on the way to the goal, at call to_item + 1
            steps = [*steps[:to_item], back[steps[to_item]]]
        elif k == 3:  # the item reached, then a reply: stopped short
            steps = steps[:to_item]
        elif k == 4:  # a detour after the pickup that still arrives
            steps = [*steps[:to_item], back[steps[to_item]], steps[to_item], *steps[to_item:]]
        walks.append({"question": row["question"], "messages": _call_messages(steps)})
    stage = tmp_path / "m_s3" / "gigpo"
    stage.mkdir(parents=True)
    (stage / "report.json").write_text(json.dumps({"command": command, "em": 0.4}))
    (stage / "heldout.jsonl").write_text("".join(json.dumps(w) + "\n" for w in walks))
    [(name, counts)] = failures.failures([tmp_path / "m_s3"]).items()
    assert name == "m_s3/gigpo"
    assert {k: counts[k] for k in failures.KINDS} == {"arrived": 2, "wrong_to_item": 1, "wrong_to_goal": 1,
                                                     "stopped": 1}
    firsts = [1, walk.distance(rows[2]["start"], rows[2]["item"]) + 1,
              walk.distance(rows[4]["start"], rows[4]["item"]) + 1]
    assert counts["first_wrong_turn"] == round(sum(firsts) / 3, 2) and counts["walks"] == 5
    assert failures.replay(rows[0], ["jump", *walk.shortest_walk(rows[0])])["first_wrong"] == 1  # not a step: wrong
    assert "| m_s3/gigpo | 5 | 2 | 1 | 1 | 1 |" in failures.table({name: counts})
    transfer = walk.task_rows(40, 5, seed=3)["transfer"]  # the other split: its own file, its own worlds
    (stage / "transfer.jsonl").write_text("".join(json.dumps({"question": row["question"], "messages": _call_messages(
        walk.shortest_walk(row))}) + "\n" for row in transfer))
    [(_, other)] = failures.failures([tmp_path / "m_s3"], "transfer").items()
    assert other["arrived"] == 5 and other["em"] is None and other["first_wrong_turn"] is None
    (stage / "report.json").write_text(json.dumps({"command": command.replace("--data-seed 3", "--data-seed 4")}))
    with pytest.raises(SystemExit, match="the held-out walks are not"):
        failures.failures([tmp_path / "m_s3"])
    with pytest.raises(SystemExit, match="the transfer walks are not"):
        failures.failures([tmp_path / "m_s3"], "transfer")
