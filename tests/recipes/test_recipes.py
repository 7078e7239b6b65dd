"""The recipes (recipes/gsm8k_tools.py, recipes/search_r1.py): TRL's parser and flag names, the YAML configs, one
training step from each config, one-line errors offline, the model card and push_to_hub, the accelerate configs.

Everything runs offline on CPU with the toy tokenizer and a tiny random Qwen2 (``tiny_model_dir``) and the fixtures
in tests/recipes/fixtures/.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_agentic.scripts import make_parser, parse_args, run

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
CONFIGS = RECIPES / "configs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ACCELERATE_CONFIGS = ["deepspeed_zero2", "deepspeed_zero3", "fsdp", "multi_gpu"]
DATA = {
    "gsm8k_tools": ["--dataset_name", str(FIXTURES / "gsm8k_small.jsonl"), "--tool", "calculator"],
    "search_r1": ["--dataset_name", str(FIXTURES / "search_questions.jsonl"),
                  "--corpus", str(FIXTURES / "search_corpus.jsonl")],
}


def load_recipe(name: str):
    """Import recipes/<name>.py as a module (the recipes are scripts, not a package)."""
    module_name = f"recipe_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, RECIPES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def script_arguments(name: str) -> type:
    recipe = load_recipe(name)
    return next(v for k, v in vars(recipe).items() if k.endswith("ScriptArguments") and k != "AgenticScriptArguments")


def tiny_flags(model_dir: str, out: Path) -> list[str]:
    """CPU-sized overrides of any config: one optimizer step, tiny budgets, evaluation on 2 rows."""
    return [
        "--model_name_or_path", model_dir, "--output_dir", str(out), "--use_cpu", "--bf16", "false",
        "--dtype", "float32", "--use_peft", "false", "--max_steps", "1", "--per_device_train_batch_size", "4",
        "--gradient_accumulation_steps", "1", "--max_completion_length", "48", "--max_tokens_per_turn", "16",
        "--max_turns", "2", "--max_observation_tokens", "32", "--max_eval_samples", "2",
        "--per_device_eval_batch_size", "2", "--save_strategy", "no", "--gradient_checkpointing", "false",
    ]


def config_path(recipe: str, algo: str) -> str:
    return str(CONFIGS / f"{recipe}_{algo}.yaml")


# ----------------------------------------------------------------------------------------------------------------
# Parsing: TRL's parser, TRL's flag names, every field reachable, the configs
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize("recipe", ["gsm8k_tools", "search_r1"])
def test_every_config_field_is_a_flag(recipe, algo):
    from trl import ModelConfig

    from trl_agentic.scripts import config_class

    parser = make_parser(script_arguments(recipe), algo)
    flags = set(parser._option_string_actions)
    for cls in (script_arguments(recipe), config_class(algo), ModelConfig):
        missing = [f.name for f in dataclasses.fields(cls) if f.init and f"--{f.name}" not in flags]
        assert not missing, f"{cls.__name__}: {missing}"


def test_trl_flag_names_override_the_yaml():
    args, training, model = parse_args(script_arguments("gsm8k_tools"), [
        "--config", config_path("gsm8k_tools", "ppo"), "--learning_rate", "3e-6", "--num_train_epochs", "2",
        "--run_name", "my-run", "--eval_strategy", "steps", "--eval_steps", "7", "--push_to_hub",
        "--hub_model_id", "me/agent", "--model_name_or_path", "some/model",
        "--advantage_mode", "turn", "--gamma", "0.99", "--lam", "0.9", "--vf_coef", "0.5", "--use_peft", "false",
        "--use_cpu",  # the configs ask for bf16, which needs a GPU or use_cpu
    ])
    assert type(training).__name__ == "AgenticPPOConfig"  # algo: ppo in the YAML picks the config class
    assert training.learning_rate == 3e-6 and training.num_train_epochs == 2 and training.run_name == "my-run"
    assert training.eval_steps == 7 and training.push_to_hub and training.hub_model_id == "me/agent"
    assert (training.advantage_mode, training.gamma, training.lam, training.vf_coef) == ("turn", 0.99, 0.9, 0.5)
    assert training.critic_learning_rate == 2e-4 and training.max_turns == 4  # from the YAML
    assert model.model_name_or_path == "some/model" and model.use_peft is False
    assert args.algo == "ppo" and args.tool == "python" and args.dataset_name == "openai/gsm8k"


@pytest.mark.parametrize("recipe,algo,expected", [
    ("search_r1", "grpo", {"num_generations": 5, "beta": 0.001, "kl_estimator": "k3", "learning_rate": 1e-6,
                           "max_observation_tokens": 500, "max_tokens_per_turn": 500, "max_turns": 5,
                           "temperature": 1.0, "epsilon": 0.2}),
    ("search_r1", "ppo", {"num_generations": 1, "beta": 0.001, "kl_estimator": "k1", "learning_rate": 1e-6,
                          "critic_learning_rate": 1e-5, "num_iterations": 1, "gamma": 1.0, "lam": 1.0,
                          "max_observation_tokens": 500}),
    ("gsm8k_tools", "grpo", {"num_generations": 8, "beta": 0.0, "rollout_mode": "text", "eval_on_start": True}),
    ("gsm8k_tools", "ppo", {"num_generations": 1, "beta": 0.0, "critic": "separate", "eval_on_start": True}),
])
def test_configs_hold_the_papers_settings(recipe, algo, expected):
    _, training, _ = parse_args(script_arguments(recipe), ["--config", config_path(recipe, algo), "--use_cpu"])
    assert {k: getattr(training, k) for k in expected} == expected
    if recipe == "search_r1":  # 512 prompts per generation over 8 processes, optimizer steps of 256 prompts
        group = training.num_generations
        assert training.generation_batch_size * 8 == 512 * group
        assert training.per_device_train_batch_size * training.gradient_accumulation_steps * 8 == 256 * group


def test_no_recipe_shadows_a_module_the_package_imports():
    """``python recipes/<name>.py`` puts recipes/ first on sys.path: a recipe named like a package the library imports
    (recipes/textarena.py) is imported in its place (``module 'textarena' has no attribute 'make'``)."""
    import ast

    imported = set()
    for path in (REPO / "trl_agentic").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    assert {"textarena", "verifiers", "trl", "torch"} <= imported
    assert not {p.stem for p in RECIPES.glob("*.py")} & imported


def test_config_keys_are_all_known():
    for path in CONFIGS.glob("*.yaml"):
        if path.stem.startswith("rft_"):  # recipes/rft.py has its own parser: tests/recipes/test_rft.py
            continue
        recipe = path.stem.rsplit("_", 1)[0]
        keys = set(yaml.safe_load(path.read_text()))
        flags = {a.lstrip("-") for a in make_parser(script_arguments(recipe), path.stem.rsplit("_", 1)[1])
                 ._option_string_actions}
        assert keys <= flags, (path.name, keys - flags)


def _command_lines(text: str, script: str) -> list[list[str]]:
    """The arguments after ``recipes/<script>.py`` of every command line in ``text`` (continuations joined)."""
    text = text.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        match = re.search(rf"recipes/{script}\.py(?=\s|$)(.*)", line)
        if match and ("python " in line or "accelerate launch" in line):
            commands.append(shlex.split(match.group(1).split("#")[0].replace("`", "")))
    return commands


@pytest.mark.parametrize("recipe", ["gsm8k_tools", "search_r1"])
def test_documented_commands_parse(recipe):
    sources = [load_recipe(recipe).__doc__, (REPO / "docs" / "recipes.md").read_text(encoding="utf-8"),
               (REPO / "docs" / "guide.md").read_text(encoding="utf-8")]
    commands = [c for text in sources for c in _command_lines(text, recipe)]
    assert len(commands) >= 5
    for argv in commands:
        if "--help" not in argv:
            argv = [a.replace("recipes/", str(RECIPES) + "/", 1) for a in argv]
            parse_args(script_arguments(recipe), [*argv, "--use_cpu"])


# ----------------------------------------------------------------------------------------------------------------
# One step from each YAML config
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize("recipe", ["gsm8k_tools", "search_r1"])
def test_one_step_from_each_config(recipe, algo, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    # one generation round of 2 prompts (Search-R1's steps_per_generation of 16 would need 32; the fixture has 5)
    extra = ["--num_generations", "2", "--steps_per_generation", "1"] if algo == "grpo" else ["--num_mini_batches", "1"]
    argv = ["--config", config_path(recipe, algo), *DATA[recipe], *tiny_flags(tiny_model_dir, out), *extra,
            "--trajectory_dir", str(tmp_path / "traj")]
    module = load_recipe(recipe)
    captured = {}

    def main(script_args, training_args, model_args):
        captured["args"] = training_args
        module.main(script_args, training_args, model_args)

    assert run(main, script_arguments(recipe), argv) == 0
    assert "{'loss'" in capsys.readouterr().out  # a step trained
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    assert captured["args"].eval_on_start  # from the YAML: evaluation before training
    # trajectories carry their reward and advantage and are a datasets-readable JSONL
    from datasets import load_dataset

    rows = load_dataset("json", data_files=str(tmp_path / "traj" / "trajectories-rank0.jsonl"), split="train")
    assert {"reward", "rewards", "advantage", "stop_reason", "num_turns"} <= set(rows.column_names)
    assert len(rows.filter(lambda r: r["reward"] is not None)) > 0


def test_eval_metrics_before_and_after_training(tiny_model_dir, tmp_path, capsys):
    """eval_on_start evaluates before the first step and TRL evaluates after the last: eval_* metrics, with the
    task's success term (eval_reward/correct), are logged both times."""
    argv = ["--config", config_path("gsm8k_tools", "grpo"), *DATA["gsm8k_tools"],
            *tiny_flags(tiny_model_dir, tmp_path / "out"), "--num_generations", "2"]
    assert run(load_recipe("gsm8k_tools").main, script_arguments("gsm8k_tools"), argv) == 0
    logged = capsys.readouterr().out
    assert logged.count("'eval_reward/correct'") == 2 and logged.count("'eval_agentic/turns_mean'") == 2
    assert logged.index("'eval_reward/correct'") < logged.index("'loss'") < logged.rindex("'eval_reward/correct'")


# ----------------------------------------------------------------------------------------------------------------
# One-line errors (offline, missing data, bad settings)
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["--model_name_or_path", "/nowhere/model"], "pass --model_name_or_path with a local model directory"),
    (["--model_name_or_path", "nobody/no-such-model"], "offline? pass --model_name_or_path"),
    (["--dataset_name", "/nowhere/data.jsonl"], "--dataset_name /nowhere/data.jsonl does not exist"),
    (["--dataset_name", "nobody/no-such-dataset"], "offline? pass --dataset_name"),
    (["--tool", "abacus"], "invalid choice: 'abacus'"),
    (["--num_generations", "3", "--per_device_train_batch_size", "4"], "num_generations"),
    (["--algo", "dqn"], "--algo 'dqn' is unknown"),
    # a local path that does not exist is no hub id: no request, "no such directory"
    (["--model_name_or_path", "outputs/gsm8k-tools-grpo/checkpoint-100"], "checkpoint-100: no such directory"),
    # native tool calls with a chat template TRL knows no response template for (the tiny model's ChatML without
    # tools): the trainer's line, at start-up instead of a traceback at the first rollout
    (["--tool", "calculator_native", "--rollout_mode", "chat"],
     "native tool calls need a response template to parse the model's calls, and TRL knows none"),
])
def test_errors_are_one_line(argv, message, tiny_model_dir, tmp_path):
    """Run as a user does (a new process, offline): exit status 2, one line naming the flag, no traceback."""
    base = ["--config", config_path("gsm8k_tools", "grpo"), "--model_name_or_path", tiny_model_dir,
            "--dataset_name", str(FIXTURES / "gsm8k_small.jsonl"), "--output_dir", str(tmp_path / "out"),
            "--use_cpu", "--bf16", "false"]
    env = {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(RECIPES / "gsm8k_tools.py"), *base, *argv], capture_output=True,
                          text=True, timeout=300, env=env)
    errors = [line for line in proc.stderr.splitlines() if re.search(r"(^|: )error: ", line)]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(errors) == 1 and message in errors[0], proc.stderr[-2000:]


def test_a_run_that_can_train_nothing_stops_before_loading_the_model(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """The Search-R1 config draws 64 prompts per generation round (20 x 16 / 5 on one process): on a 5-question file
    TRL's sampler yields nothing and transformers ends at step 0 (exit 0). It stops first, naming the numbers."""
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    argv = ["--config", config_path("search_r1", "grpo"), *DATA["search_r1"], "--model_name_or_path", tiny_model_dir,
            "--output_dir", str(tmp_path / "out"), "--use_cpu", "--bf16", "false"]
    assert run(load_recipe("search_r1").main, script_arguments("search_r1"), argv) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert error.startswith("error: the training data has 5 prompts, fewer than the 64 one generation round draws")
    assert "per_device_train_batch_size 20 x 1 process(es) x steps_per_generation 16 / num_generations 5" in error
    assert "lower --per_device_train_batch_size or --steps_per_generation" in error
    assert not (tmp_path / "out").exists()
    # PPO names its own flags; enough rows train
    argv = ["--config", config_path("search_r1", "ppo"), *DATA["search_r1"], "--model_name_or_path", tiny_model_dir,
            "--output_dir", str(tmp_path / "out"), "--use_cpu", "--bf16", "false"]
    assert run(load_recipe("search_r1").main, script_arguments("search_r1"), argv) == 2
    assert "--gradient_accumulation_steps or --num_mini_batches" in capsys.readouterr().err


def test_a_retrieval_server_that_is_down_stops_the_run_at_start_up(tiny_model_dir, tmp_path, capsys):
    """--retriever_url to a closed port: one line at start-up with the command that starts a server, not a whole
    run in which every search is an error observation."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["--config", config_path("search_r1", "grpo"), "--model_name_or_path", tiny_model_dir,
            "--dataset_name", str(FIXTURES / "search_questions.jsonl"), "--use_cpu", "--bf16", "false",
            "--retriever_url", f"http://127.0.0.1:{port}/retrieve", "--output_dir", str(tmp_path)]
    assert run(load_recipe("search_r1").main, script_arguments("search_r1"), argv) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error.startswith(f"error: --retriever_url http://127.0.0.1:{port}/retrieve: retrieval server at ")
    assert "is unreachable" in error and "python -m trl_agentic.tools.retrieval.server" in error


def test_the_configs_run_on_a_cpu_as_written(capsys):
    """The configs ask for bf16; without a GPU the recipes add --use_cpu true --bf16 false --dtype float32, say so,
    and keep what the command line sets."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the configs run as they are")
    _, training, model = parse_args(script_arguments("search_r1"), ["--config", config_path("search_r1", "grpo")])
    assert training.use_cpu and not training.bf16 and model.dtype == "float32"
    assert "no GPU: running on the CPU (--use_cpu true --bf16 false --dtype float32 added" in \
        capsys.readouterr().err
    _, training, model = parse_args(script_arguments("gsm8k_tools"), ["--config", config_path("gsm8k_tools", "ppo"),
                                                                      "--dtype", "bfloat16"])
    assert training.use_cpu and not training.bf16 and model.dtype == "bfloat16"
    assert "(--use_cpu true --bf16 false added" in capsys.readouterr().err
    # --use_cpu on the command line: the user chose, nothing is added (nor said)
    _, training, model = parse_args(script_arguments("gsm8k_tools"), ["--config", config_path("gsm8k_tools", "ppo"),
                                                                      "--use_cpu"])
    assert training.use_cpu and training.bf16 and model.dtype == "bfloat16" and not capsys.readouterr().err


def test_offline_retriever_missing_is_one_line(tiny_model_dir, tmp_path, capsys):
    argv = ["--config", config_path("search_r1", "grpo"), "--model_name_or_path", tiny_model_dir,
            "--dataset_name", str(FIXTURES / "search_questions.jsonl"), "--use_cpu", "--bf16", "false",
            "--output_dir", str(tmp_path)]
    assert run(load_recipe("search_r1").main, script_arguments("search_r1"), argv) == 2
    assert capsys.readouterr().err.strip().startswith("error: no retriever: pass --corpus")


# ----------------------------------------------------------------------------------------------------------------
# Model card and push_to_hub through TRL's flags
# ----------------------------------------------------------------------------------------------------------------


class FakeHubAPI:
    """Records what push_to_hub would upload (create_repo, upload_folder with the README at upload time)."""

    def __init__(self):
        self.uploads = []

    def create_repo(self, repo_id, **kwargs):
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def upload_folder(self, repo_id, folder_path, **kwargs):
        readme = Path(folder_path) / "README.md"
        self.uploads.append({"repo_id": repo_id, "readme": readme.read_text() if readme.exists() else None,
                             "files": sorted(p.name for p in Path(folder_path).iterdir())})


def test_model_card_and_push_to_hub(tiny_model_dir, tmp_path, monkeypatch):
    import transformers.trainer

    api = FakeHubAPI()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: api)
    out = tmp_path / "out"
    argv = ["--config", config_path("gsm8k_tools", "grpo"), *DATA["gsm8k_tools"], *tiny_flags(tiny_model_dir, out),
            "--num_generations", "2", "--eval_strategy", "no", "--push_to_hub", "--hub_model_id", "me/tiny-agent"]
    assert run(load_recipe("gsm8k_tools").main, script_arguments("gsm8k_tools"), argv) == 0
    assert api.uploads and all(u["repo_id"] == "me/tiny-agent" for u in api.uploads)
    card = api.uploads[-1]["readme"]
    assert "model.safetensors" in api.uploads[-1]["files"]
    assert "[None]" not in card and f"the local model `{tiny_model_dir}`" in card
    assert "`<calc>...</calc>` calls a tool; its output comes back as `<result>...</result>`" in card
    assert "write one arithmetic expression between <calc>" in card  # the prompt
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny-agent")' in card and "run_rollouts(" in card


def test_model_card_snippet_runs(tiny_model_dir, tmp_path, monkeypatch):
    """The "Use it" code of the card, run against the saved model, rolls out a trajectory."""
    out = tmp_path / "out"
    argv = ["--config", config_path("gsm8k_tools", "grpo"), *DATA["gsm8k_tools"], *tiny_flags(tiny_model_dir, out),
            "--num_generations", "2", "--eval_strategy", "no"]
    assert run(load_recipe("gsm8k_tools").main, script_arguments("gsm8k_tools"), argv) == 0
    card = (out / "README.md").read_text()
    snippet = card.split("## Use it", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert f'from_pretrained("{out}")' in snippet
    namespace: dict = {}
    exec(compile(snippet, "model-card-snippet", "exec"), namespace)  # noqa: S102 - our own generated code
    (trajectory,) = namespace["trajectories"]
    assert trajectory.num_turns >= 1 and trajectory.completion_ids


# ----------------------------------------------------------------------------------------------------------------
# Accelerate configs
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(RECIPES / "accelerate" / f"{name}.yaml"))
    expected = {"multi_gpu": "MULTI_GPU", "fsdp": "FSDP"}.get(name, "DEEPSPEED")
    assert str(config.distributed_type).endswith(expected) and config.mixed_precision == "bf16"
    if name.startswith("deepspeed"):
        assert config.deepspeed_config["zero_stage"] == int(name[-1])
    assert f"recipes/accelerate/{name}.yaml" in (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
