"""What tests can do with a program they run apart from (run_unit_tests): call its functions, use its classes,
objects, generators, constants and modules, see its in-place changes and its exceptions; and what they cannot."""

from __future__ import annotations

from textwrap import dedent

from trl_agentic.tools import PythonSandbox
from trl_agentic.tools.code.unit_tests import run_unit_tests

STACK = dedent(
    """
    class Stack:
        def __init__(self):
            self.items = []

        def push(self, x):
            self.items.append(x)
            return self

        def pop(self):
            return self.items.pop()

        def __len__(self):
            return len(self.items)
    """
)

HELPERS = dedent(
    """
    def sort_in_place(a):
        a.sort()

    def fill(d, key):
        d[key] = len(d)

    def check_positive(x):
        if x <= 0:
            raise ValueError('not positive')
        return x

    def evens(n):
        yield from range(0, n, 2)
    """
)

VALUE = (
    "{(1, 2): {3}, 'b': b'x', 'a': bytearray(b'y'), 'c': 1 + 2j, 'n': 10 ** 5000, 'f': frozenset([1]), "
    "'r': range(3), 'x': 0.5, 't': None}"
)


def test_functions_constants_and_modules(sandbox):
    program = "import math\nLIMIT = 10\ndef area(r):\n    return math.pi * r * r\n"
    tests = ["assert math.isclose(area(1), math.pi)", "assert LIMIT == 10", "assert area(2) == 1"]
    assert run_unit_tests(sandbox, program, tests) == [True, True, False]


def test_humaneval_check_function(sandbox):
    test = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n\ncheck(add)\n"
    assert run_unit_tests(sandbox, "def add(a, b):\n    return a + b\n", [test]) == [True]


def test_classes_objects_and_identity(sandbox):
    test = "s = Stack()\nassert s.push(1) is s\ns.push(2)\nassert len(s) == 2 and s.items == [1, 2]\n"
    test += "assert s.pop() == 2 and len(s) == 1\nassert s != Stack()\n"
    assert run_unit_tests(sandbox, STACK, [test]) == [True]


def test_in_place_changes_exceptions_and_generators(sandbox):
    tests = [
        "a = [3, 1, 2]\nsort_in_place(a)\nassert a == [1, 2, 3]",
        "d = {}\nfill(d, 'x')\nfill(d=d, key='y')\nassert d == {'x': 0, 'y': 1}",
        "try:\n    check_positive(-1)\nexcept ValueError as e:\n    assert 'not positive' in str(e)\nelse:\n    1 / 0",
        "assert list(evens(5)) == [0, 2, 4]\nassert 2 in evens(3)",
    ]
    assert run_unit_tests(sandbox, HELPERS, tests) == [True] * 4


def test_values_cross_exactly(sandbox):
    program = f"import collections\ndef g():\n    return {VALUE}\n"
    program += "def h():\n    return collections.OrderedDict(a=1), collections.namedtuple('P', 'x y')(1, 2)\n"
    tests = [f"assert g() == {VALUE}", "d, p = h()\nassert d == {'a': 1} and p == (1, 2)"]
    assert run_unit_tests(sandbox, program, tests) == [True, True]


def test_program_failures(sandbox):
    broken = "raise RuntimeError('broken')\ndef f():\n    return 1\n"
    assert run_unit_tests(sandbox, broken, ["assert f() == 1"]) == [False]
    assert run_unit_tests(sandbox, "def f(:\n", ["assert f() == 1", "assert True"]) == [False, False]


def test_a_dying_or_hanging_program_is_restarted_for_the_next_test(sandbox):
    program = dedent(
        """
        import os
        def f(x):
            if x == 0:
                os._exit(1)
            while x == 1:
                pass
            return x
        """
    )
    tests = ["assert f(0) == 0", "assert f(2) == 2", "assert f(1) == 1", "assert f(3) == 3"]
    quick = PythonSandbox(backend=sandbox.backend, timeout=2, pool_size=0)
    try:
        assert run_unit_tests(quick, program, tests) == [False, True, False, True]
    finally:
        quick.close()


def test_what_a_test_cannot_pass_to_the_program(sandbox):
    program = "def apply(f, x):\n    return f(x)\n"
    assert run_unit_tests(sandbox, program, ["assert apply(lambda v: v + 1, 1) == 2"]) == [False]


def test_builtins_are_never_taken_from_the_program(sandbox):
    program = "def sorted(x):\n    return 'hacked'\ndef f():\n    return [2, 1]\n"
    assert run_unit_tests(sandbox, program, ["assert sorted(f()) == [1, 2]"]) == [True]
