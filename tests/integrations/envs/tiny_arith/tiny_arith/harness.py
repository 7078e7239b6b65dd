"""tiny-arith's harness: a chat loop with one tool, run in-process. Every model call goes to the interception
``endpoint`` with the rollout's ``secret`` ("the interception is the contract, not the process")."""

import json

from openai import AsyncOpenAI
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult, Runtime
from verifiers.v1.task import TaskData
from verifiers.v1.trace import Trace

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]


class ToolLoopHarnessConfig(HarnessConfig):
    max_steps: int = 4
    """Model calls per rollout at most."""
    stream: bool = False
    """Ask for server-sent events (as verifiers' `null` harness always does)."""
    crash_on_odd: bool = False
    """Raise after the first model call on tasks whose `a` is odd (a harness that crashes)."""


class ToolLoopHarness(Harness[ToolLoopHarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True  # a Messages prompt relaunches it on the conversation: it can answer a user (user-sim)
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: ModelContext, trace: Trace, runtime: Runtime, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: TaskData) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = ([{"role": "system", "content": system}] if system else []) + (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else
            [m.model_dump(exclude_none=True) for m in prompt or []])
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            for _ in range(self.config.max_steps):
                message = await self._complete(client, ctx.model, messages)
                messages.append(message)
                if self.config.crash_on_odd and getattr(data, "a", 0) % 2:
                    raise RuntimeError("the harness crashed")
                if not message.get("tool_calls"):
                    break
                for call in message["tool_calls"]:
                    try:
                        args = json.loads(call["function"]["arguments"])
                        result = str(int(args["a"]) + int(args["b"]))
                    except (ValueError, KeyError, TypeError) as exc:
                        result = f"error: {exc}"
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return ProgramResult(exit_code=0, stdout="", stderr="")

    async def _complete(self, client: AsyncOpenAI, model: str, messages: list) -> dict:
        if not self.config.stream:
            reply = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
            return reply.choices[0].message.model_dump(exclude_none=True)
        content, calls = "", {}
        stream = await client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True)
        async for chunk in stream:
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta is None:
                continue
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                entry["id"] = call.id or entry["id"]
                entry["function"]["name"] += (call.function.name or "") if call.function else ""
                entry["function"]["arguments"] += (call.function.arguments or "") if call.function else ""
        message = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message

