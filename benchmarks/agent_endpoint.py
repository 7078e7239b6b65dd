"""The same task as an ``Environment`` and as an agent through the OpenAI-compatible endpoint: rollout time side by
side at several numbers of concurrent agents, and the latency the endpoint adds to each model call.

    python benchmarks/agent_endpoint.py [--agents 8 32 64] [--turns 3] [--tokens-per-turn 32] [--repeats 5]

The workload is the one of ``benchmarks/rollout_speed.py``: a random Qwen2 (``--hidden 256 --layers 4``) over the
tiny Qwen2.5-Instruct tokenizer and chat template of ``tests/conventions.py``, its ``generate`` forced by a logits
processor to write, in turn ``k`` of ``--turns``, a ``lookup`` tool call (or, last, an answer), each turn exactly
``--tokens-per-turn`` tokens; every forward pass still runs. Both sides use the same model, generator
(``HFGenerator``), budgets and seeds:

- **environment**: :class:`~trl_agentic.rollout.engine.RolloutEngine` with a
  :class:`~trl_agentic.native_tools.ToolCallEnvironment` of the ``lookup`` tool (native tool calls: the schema in the
  prompt, each turn parsed by the chat template's response template), one ``generate`` call per turn for all
  trajectories;
- **agent**: :class:`~trl_agentic.agents.AgentRollout` with an ``async`` agent written with the OpenAI SDK (the same
  prompt and tool; the endpoint parses the call with the chat template's response template, the agent runs the tool
  and sends the result back), its calls batched by the bridge.

The script checks that both sides produced identical prompt ids, completion ids and masks, then reports per number of
agents the median rollout time of each side (rollouts interleaved, after one warm-up each), their ratio
(agent / environment), the ``generate`` calls of each, and the latency added per model call: (agent time -
environment time) / turns, since a trajectory's calls are sequential and the calls of one turn are concurrent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def make_agent(tool: Lookup, schema: dict[str, Any]):
    async def agent(client, **row):
        messages = [dict(m) for m in PROMPT]
        while True:
            response = await client.chat.completions.create(model="policy", messages=messages, tools=[schema])
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content
            for call in message.tool_calls:
                result = await asyncio.to_thread(tool, **json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})

    return agent


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from trl_agentic.agents import Agent, AgentRollout
    from trl_agentic.native_tools import ToolCallEnvironment
    from trl_agentic.rollout.engine import RolloutConfig, RolloutEngine
    from trl_agentic.rollout.generation import HFGenerator, get_eos_token_ids

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    model = build_model(tokenizer, args.hidden, args.layers).eval()
    log = script_model(model, Script(tokenizer, args.turns, args.tokens_per_turn))
    tool = Lookup(0.0)
    schema = lookup_schema(tool)
    config = RolloutConfig(max_turns=args.turns, max_tokens_per_turn=args.tokens_per_turn + 1,
                           max_completion_length=args.turns * (args.tokens_per_turn + 64), rollout_mode="chat",
                           overlap_chunks=1)
    generator = HFGenerator(model, tokenizer)
    eos = get_eos_token_ids(tokenizer, model.generation_config)
    engine = RolloutEngine(generator, tokenizer, lambda: ToolCallEnvironment([tool.as_function()]), config)
    rollout = AgentRollout(Agent(make_agent(tool, schema), batch_window=args.window), tokenizer, config, eos)

    def environment_side(n: int) -> tuple[float, int, list]:
        log.clear()
        torch.manual_seed(0)
        start = time.perf_counter()
        out = engine.run([PROMPT] * n, [{} for _ in range(n)])
        return time.perf_counter() - start, len(log.seconds), out

    def agent_side(n: int) -> tuple[float, int, list]:
        log.clear()
        torch.manual_seed(0)
        start = time.perf_counter()
        out = rollout.run([{} for _ in range(n)], generator)
        return time.perf_counter() - start, len(log.seconds), out

    results = []
    for n in args.agents:
        times: dict[str, list[float]] = {"environment": [], "agent": []}
        calls: dict[str, int] = {}
        for repeat in range(args.repeats + 1):
            for name, side in (("environment", environment_side), ("agent", agent_side)):
                seconds, generate_calls, out = side(n)
                if repeat:  # the first of each is a warm-up
                    times[name].append(seconds)
                calls[name] = generate_calls
                if name == "environment":
                    reference = [(t.prompt_ids, t.completion_ids, t.env_mask) for t in out]
                else:
                    same = [(t.prompt_ids, t.completion_ids, t.env_mask) for t in out] == reference
                    if not same or any(t.stop_reason != "terminated" for t in out):
                        raise SystemExit(f"the two sides differ at {n} agents: "
                                         f"{[t.stop_reason + ' ' + t.error for t in out][:3]}")
        env, agent = statistics.median(times["environment"]), statistics.median(times["agent"])
        results.append({"agents": n, "environment_s": env, "agent_s": agent, "ratio": agent / env,
                        "environment_generate_calls": calls["environment"], "agent_generate_calls": calls["agent"],
                        "added_ms_per_call": 1000 * (agent - env) / args.turns,
                        "environment_runs_s": times["environment"], "agent_runs_s": times["agent"]})
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in results[-1].items()
                          if not k.endswith("runs_s")}), flush=True)
    rollout.close()
    return {"settings": vars(args), "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[8, 32, 64], help="concurrent agents (trajectories)")
    parser.add_argument("--turns", type=int, default=3, help="model turns per trajectory (tool calls + answer)")
    parser.add_argument("--tokens-per-turn", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="measured rollouts per side (after one warm-up)")
    parser.add_argument("--window", type=float, default=0.02, help="the agent side's batch_window, seconds")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--json", help="write the measurements to this file")
    args = parser.parse_args()
    report = run(args)
    print(f"{'agents':>6}  {'environment s':>13}  {'agent s':>8}  {'ratio':>6}  {'generate calls env/agent':>24}  "
          f"{'added ms per call':>17}")
    for r in report["results"]:
        print(f"{r['agents']:>6}  {r['environment_s']:>13.3f}  {r['agent_s']:>8.3f}  {r['ratio']:>6.3f}  "
              f"{str(r['environment_generate_calls']) + ' / ' + str(r['agent_generate_calls']):>24}  "
              f"{r['added_ms_per_call']:>17.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
