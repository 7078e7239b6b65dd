"""The same task as an ``Environment`` and as an agent through the OpenAI-compatible endpoint: rollout time side by
side at several numbers of concurrent agents, and the latency the endpoint adds to each model call.

    python benchmarks/agent_endpoint.py [--agents 8 32 64] [--turns 3] [--tokens-per-turn 32] [--repeats 5]
    python benchmarks/agent_endpoint.py --endpoint-only [--agents 64] [--repeats 2]

The workload is the one of ``benchmarks/rollout_speed.py``: a random Qwen2 (``--hidden 256 --layers 4``) over the
tiny Qwen2.5-Instruct tokenizer and chat template of ``tests/conventions.py``, its ``generate`` forced by a logits
processor to write, in turn ``k`` of ``--turns``, a ``lookup`` tool call (or, last, an answer), each turn exactly
``--tokens-per-turn`` tokens; every forward pass still runs. Both sides use the same model, generator
(``HFGenerator``), budgets and seeds:

- **environment**: :class:`~trl_agentic.rollout.engine.RolloutEngine` with a
  :class:`~trl_agentic.environments.native_tools.ToolCallEnvironment` of the ``lookup`` tool (native tool calls: the schema in the
  prompt, each turn parsed by the chat template's response template), one ``generate`` call per turn for all
  trajectories;
- **agent**: :class:`~trl_agentic.agents.AgentRollout` with an ``async`` agent written with the OpenAI SDK (the same
  prompt and tool; the endpoint parses the call with the chat template's response template, the agent runs the tool
  and sends the result back), its calls batched by the bridge.

The script checks that both sides produced identical prompt ids, completion ids and masks, then reports per number of
agents: the median rollout time of each side (rollouts interleaved, after one warm-up each), their ratio
(agent / environment) and the median of the ratios of back-to-back pairs, the process CPU time of each side (all
threads: on a shared machine it varies less than wall time) and its ratio, the most ``generate`` calls of a rollout
on each side, and the cost added per model call: wall, (agent time - environment time) / turns, since a
trajectory's calls are sequential and those of one turn concurrent; CPU, (agent CPU - environment CPU) / requests.

``--endpoint-only``: the agent side alone against an instant generator (each turn's scripted text tokenized, no
model), so that the time is the endpoint's, the agents' and the SDK's own: wall and process CPU time per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_speed import PROMPT, Lookup, Script, build_model, load_tokenizer, script_model  # noqa: E402


def lookup_schema(tool: Lookup) -> dict[str, Any]:
    from transformers.utils import get_json_schema

    return get_json_schema(tool.as_function())


def make_agent(tool: Lookup, tools: list[dict[str, Any]]):
    """The agent: the row's ``system`` prompt (if any), then ``PROMPT``, sent with ``tools`` (or the row's ``tools``);
    it runs each ``lookup`` call and sends the result back, until the model answers. It starts ``delay`` seconds
    late (the row's)."""

    async def agent(client, system=None, delay=0.0, **row):
        if delay:
            await asyncio.sleep(delay)
        messages = [{"role": "system", "content": system}] if system else []
        messages += [dict(m) for m in PROMPT]
        while True:
            response = await client.chat.completions.create(model="policy", messages=messages,
                                                            tools=row.get("tools", tools))
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for call in message.tool_calls:
                result = await asyncio.to_thread(tool, **json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})

    return agent


def scripted_setup(args: argparse.Namespace) -> tuple[Any, Any, Any, list[int]]:
    """The tokenizer, the random Qwen2 of ``--hidden``/``--layers`` scripted for ``--turns`` turns of
    ``--tokens-per-turn`` tokens, the log of its ``generate`` calls and its end ids; torch on ``--threads``."""
    import torch

    from trl_agentic.rollout.generation import get_eos_token_ids

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    model = build_model(tokenizer, args.hidden, args.layers).eval()
    log = script_model(model, Script(tokenizer, args.turns, args.tokens_per_turn))
    return tokenizer, model, log, get_eos_token_ids(tokenizer, model.generation_config)


def rollout_config(args: argparse.Namespace, **fields: Any) -> Any:
    """The ``RolloutConfig`` of ``--turns`` chat turns of ``--tokens-per-turn`` tokens, with ``fields``."""
    from trl_agentic.rollout.config import RolloutConfig

    return RolloutConfig(max_turns=args.turns, max_tokens_per_turn=args.tokens_per_turn + 1,
                         max_completion_length=args.turns * (args.tokens_per_turn + 64), rollout_mode="chat", **fields)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trl_agentic.agents import Agent, AgentRollout
    from trl_agentic.environments.native_tools import ToolCallEnvironment
    from trl_agentic.rollout.engine import RolloutEngine
    from trl_agentic.rollout.generation import HFGenerator

    tokenizer, model, log, eos = scripted_setup(args)
    tool = Lookup(0.0)
    schema = lookup_schema(tool)
    config = rollout_config(args, overlap_chunks=1)
    generator = HFGenerator(model, tokenizer)
    engine = RolloutEngine(generator, tokenizer, lambda: ToolCallEnvironment([tool.as_function()]), config)
    rollout = AgentRollout(Agent(make_agent(tool, [schema]), batch_window=args.window), tokenizer, config, eos)

    def environment_side(n: int) -> list:
        return engine.run([PROMPT] * n, [{} for _ in range(n)])

    def agent_side(n: int) -> list:
        return rollout.run([{} for _ in range(n)], generator)

    def timed(side, n: int) -> tuple[float, float, int, list]:
        """Wall and process CPU seconds (every thread: server, agents, generation), ``generate`` calls, output."""
        log.clear()
        torch.manual_seed(0)
        start, cpu = time.perf_counter(), time.process_time()
        out = side(n)
        return time.perf_counter() - start, time.process_time() - cpu, len(log.seconds), out

    results = []
    for n in args.agents:
        times: dict[str, list[float]] = {"environment": [], "agent": []}
        cpu: dict[str, list[float]] = {"environment": [], "agent": []}
        calls: dict[str, list[int]] = {"environment": [], "agent": []}
        load = os.getloadavg()[0]
        for repeat in range(args.repeats + 1):
            for name, side in (("environment", environment_side), ("agent", agent_side)):
                seconds, cpu_seconds, generate_calls, out = timed(side, n)
                if repeat:  # the first of each is a warm-up
                    times[name].append(seconds)
                    cpu[name].append(cpu_seconds)
                    calls[name].append(generate_calls)
                if name == "environment":
                    reference = [(t.prompt_ids, t.completion_ids, t.env_mask) for t in out]
                else:
                    same = [(t.prompt_ids, t.completion_ids, t.env_mask) for t in out] == reference
                    if not same or any(t.stop_reason != "terminated" for t in out):
                        raise SystemExit(f"the two sides differ at {n} agents: "
                                         f"{[t.stop_reason + ' ' + t.error for t in out][:3]}")
        env, agent = statistics.median(times["environment"]), statistics.median(times["agent"])
        env_cpu, agent_cpu = statistics.median(cpu["environment"]), statistics.median(cpu["agent"])
        pairs = [a / e for a, e in zip(times["agent"], times["environment"])]
        results.append({"agents": n, "environment_s": env, "agent_s": agent, "ratio": agent / env,
                        "pair_ratio": statistics.median(pairs), "environment_cpu_s": env_cpu, "agent_cpu_s": agent_cpu,
                        "cpu_ratio": agent_cpu / env_cpu,
                        "environment_generate_calls": max(calls["environment"]),
                        "agent_generate_calls": max(calls["agent"]),
                        "added_ms_per_call": 1000 * (agent - env) / args.turns,
                        "added_cpu_ms_per_request": 1000 * (agent_cpu - env_cpu) / (args.turns * n),
                        "load_average": [load, os.getloadavg()[0]],
                        "environment_runs_s": times["environment"], "agent_runs_s": times["agent"]})
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in results[-1].items()
                          if not k.endswith("runs_s")}), flush=True)
    rollout.close()
    return {"settings": vars(args), "results": results}


class InstantGenerator:
    """The scripted turns without a model: each call tokenizes the turn the context is at (no forward pass)."""

    def __init__(self, tokenizer: Any, script: Script) -> None:
        self.tokenizer, self.script = tokenizer, script

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        import torch

        from trl_agentic.rollout.generation import Generation

        turn, _ = self.script.positions(torch.tensor(_left_pad(prompts)))
        return [Generation(list(self.script.turns[k])[:max_new_tokens]) for k in turn.tolist()]


def _left_pad(prompts: list[list[int]]) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    return [[p[0]] * (width - len(p)) + p for p in prompts]


def run_endpoint_only(args: argparse.Namespace) -> dict[str, Any]:
    from trl_agentic.agents import Agent, AgentRollout

    tokenizer = load_tokenizer()
    tool = Lookup(0.0)
    script = Script(tokenizer, args.turns, args.tokens_per_turn)
    config = rollout_config(args)
    rollout = AgentRollout(Agent(make_agent(tool, [lookup_schema(tool)]), batch_window=args.window), tokenizer, config,
                           [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    generator = InstantGenerator(tokenizer, script)
    rollout.run([{}] * 2, generator)  # warm-up: imports, first template probes
    results = []
    for n in args.agents:
        for _ in range(args.repeats):
            start, cpu = time.perf_counter(), time.process_time()
            out = rollout.run([{} for _ in range(n)], generator)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            requests = sum(t.requests for t in out)
            if any(t.stop_reason != "terminated" for t in out) or requests != n * args.turns:
                raise SystemExit(f"unexpected runs: {[t.stop_reason + ' ' + t.error for t in out][:3]}")
            results.append({"agents": n, "requests": requests, "wall_s": seconds, "cpu_s": cpu_seconds,
                            "cpu_ms_per_request": 1000 * cpu_seconds / requests, "load_average": os.getloadavg()[0]})
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in results[-1].items()}),
                  flush=True)
    rollout.close()
    return {"settings": vars(args), "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[8, 32, 64], help="concurrent agents (trajectories)")
    parser.add_argument("--turns", type=int, default=3, help="model turns per trajectory (tool calls + answer)")
    parser.add_argument("--tokens-per-turn", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="measured rollouts per side (after one warm-up)")
    parser.add_argument("--window", type=float, default=0.02, help="the agent side's batch_window, seconds")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", help="write the measurements to this file")
    parser.add_argument("--endpoint-only", action="store_true",
                        help="the agent side alone, against an instant scripted generator (no model)")
    args = parser.parse_args()
    if args.endpoint_only:
        report = run_endpoint_only(args)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2))
        return
    report = run(args)
    print(f"{'agents':>6}  {'env s':>7}  {'agent s':>7}  {'ratio':>6}  {'pairs':>6}  {'env cpu':>7}  "
          f"{'agent cpu':>9}  {'cpu ratio':>9}  {'calls env/agent':>15}  {'ms/call':>7}  {'cpu ms/request':>14}")
    for r in report["results"]:
        calls = f"{r['environment_generate_calls']} / {r['agent_generate_calls']}"
        print(f"{r['agents']:>6}  {r['environment_s']:>7.2f}  {r['agent_s']:>7.2f}  {r['ratio']:>6.3f}  "
              f"{r['pair_ratio']:>6.3f}  {r['environment_cpu_s']:>7.2f}  {r['agent_cpu_s']:>9.2f}  "
              f"{r['cpu_ratio']:>9.3f}  {calls:>15}  {r['added_ms_per_call']:>7.1f}  "
              f"{r['added_cpu_ms_per_request']:>14.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
