"""Programs that try to raise ``CodeTestsReward`` without solving the task.

Every hostile program below defines a wrong ``add`` (it returns 7) and then attacks the harness: patching the
functions that run or report the tests in its own interpreter, forging protocol replies, leaving before the tests,
or returning objects that compare equal to anything. None of them may score above 0. An honest program scores 1,
so a harness that fails everything cannot pass this file.
"""

from __future__ import annotations

import pytest

from trl_agentic.rewards import CodeTestsReward
from trl_agentic.tools import PythonSandbox

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add('a', 'b') == 'ab'"]
WRONG = "def add(a, b):\n    return 7\n"

HACKS = {
    # the REPL that runs the test blocks lives in the program's interpreter as __main__
    "patch_run_block": "import sys\nsys.modules['__main__']._run_block = lambda *args: None\n" + WRONG,
    "patch_error_formatting": "import sys\nsys.modules['__main__']._format_error = lambda exc: None\n" + WRONG,
    "patch_reply": (
        "import sys\nmain = sys.modules['__main__']\nsend = main._send\n"
        "main._send = lambda fd, msg: send(fd, {**msg, 'error': None})\n" + WRONG
    ),
    "patch_every_module_function": (
        "import sys, types\n"
        "for module in list(sys.modules.values()):\n"
        "    for name, value in list(vars(module).items()):\n"
        "        if name in ('_run_block', '_format_error', 'run_block', 'format_error'):\n"
        "            setattr(module, name, lambda *args, **kwargs: None)\n" + WRONG
    ),
    # forged replies on every descriptor the program can reach (the reply pipe among them)
    "forged_replies_on_all_fds": (
        "import json, os, struct\n"
        "ok = json.dumps({'error': None, 'dropped': {}}).encode()\n"
        "for fd in range(0, 256):\n"
        "    for _ in range(8):\n"
        "        try:\n"
        "            os.write(fd, struct.pack('>I', len(ok)) + ok)\n"
        "        except OSError:\n"
        "            break\n" + WRONG
    ),
    # a thread keeps a forged "passed" reply ahead of every real one on the reply pipe named in sys.argv
    "forged_replies_from_a_thread": (
        "import json, os, struct, sys, threading, time\n"
        "fd = next(json.loads(arg) for arg in sys.argv if arg.startswith('{'))['out_fd']\n"
        "ok = json.dumps({'error': None, 'dropped': {}}).encode()\n"
        "def forge():\n"
        "    while True:\n"
        "        os.write(fd, struct.pack('>I', len(ok)) + ok)\n"
        "        time.sleep(0.002)\n"
        "threading.Thread(target=forge, daemon=True).start()\n" + WRONG
    ),
    "fake_verdict_on_stdout": (
        "import json, struct, sys\n"
        "ok = json.dumps({'error': None, 'dropped': {}, 'passed': True, 'verdict': 'pass'})\n"
        "for _ in range(8):\n"
        "    print(ok)\n"
        "    sys.stdout.buffer.write(struct.pack('>I', len(ok)) + ok.encode())\n" + WRONG
    ),
    "exit_before_tests": WRONG + "import os\nos._exit(0)\n",
    "system_exit_before_tests": WRONG + "raise SystemExit(0)\n",
    "exit_inside_the_function": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "system_exit_inside_the_function": "def add(a, b):\n    raise SystemExit(0)\n",
    "assertion_error_replaced": "import builtins\nbuiltins.AssertionError = type('Quiet', (Exception,), {})\n" + WRONG,
    "equal_to_everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Anything()\n"
    ),
    "int_equal_to_everything": (
        "class Int(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Int(7)\n"
    ),
    "str_equal_to_everything": (
        "class Str(str):\n    def __eq__(self, other):\n        return True\n    __hash__ = str.__hash__\n"
        "def add(a, b):\n    return Str('x')\n"
    ),
    "trace_hook_skips_asserts": (
        "import sys\n"
        "def tracer(frame, event, arg):\n"
        "    if event == 'exception' and issubclass(arg[0], AssertionError):\n"
        "        frame.f_trace_lines = False\n"
        "    return tracer\n"
        "sys.settrace(tracer)\nsys.excepthook = lambda *a: None\n" + WRONG
    ),
    "builtins_swallow_exceptions": (
        "import builtins, sys\n"
        "real_exec = builtins.exec\n"
        "def quiet_exec(code, *args, **kwargs):\n"
        "    try:\n        return real_exec(code, *args, **kwargs)\n    except BaseException:\n        return None\n"
        "builtins.exec = quiet_exec\n"
        "builtins.eval = lambda *a, **k: None\n" + WRONG
    ),
}


@pytest.fixture(scope="module")
def sandbox():
    sb = PythonSandbox(timeout=5, pool_size=2)
    yield sb
    sb.close()


def score(sandbox, program, tests=TESTS):
    reward = CodeTestsReward(sandbox=sandbox)
    return reward(prompts=["q"], completions=[f"<answer>{program}</answer>"], tests=[tests])[0]


def test_honest_program_scores_one(sandbox):
    assert score(sandbox, "def add(a, b):\n    return a + b\n") == 1.0


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hack_scores_zero(sandbox, name):
    assert score(sandbox, HACKS[name]) == 0.0, name


def test_patched_helper_module_does_not_pass_a_float_test(sandbox):
    # MBPP-style tests call helpers of modules the program imported; a program that patches them must not pass.
    program = "import math\nmath.isclose = lambda *a, **k: True\ndef area(r):\n    return 0.0\n"
    assert score(sandbox, program, ["assert math.isclose(area(2), 12.566370614359172)"]) == 0.0


def test_redefined_check_helper_does_not_pass_a_humaneval_test(sandbox):
    # HumanEval: the test defines check(candidate) and calls it; a program that prepares a check of its own, or
    # that patches how functions get defined, must not pass.
    program = (
        "import builtins\n"
        "def check(candidate):\n    return None\n"
        "real_build_class = builtins.__build_class__\n"
        "builtins.check = check\n" + WRONG
    )
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n\ncheck(add)\n"
    assert score(sandbox, program, [test]) == 0.0
