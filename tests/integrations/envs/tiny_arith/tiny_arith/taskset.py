"""tiny-arith's taskset: "What is a plus b?", answered with the harness's ``add`` tool; the reward is whether the last
reply holds the sum, and a small one for having called the tool."""

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    a: int
    b: int
    answer: int


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer) in trace.last_reply)

    @vf.reward(weight=0.1)
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(any(message.tool_calls for message in trace.assistant_messages))

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(message.tool_calls or []) for message in trace.assistant_messages))


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 8


class TinyArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        return [
            ArithTask(ArithData(idx=i, prompt=f"What is {i} plus 3?", a=i, b=3, answer=i + 3), self.config.task)
            for i in range(self.config.num_tasks)
        ]
