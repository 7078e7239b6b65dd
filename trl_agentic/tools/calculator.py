"""A safe arithmetic calculator tool.

The expression is parsed with :mod:`ast` and evaluated by walking the tree: only numbers, ``+ - * / // % **``,
unary ``+``/``-``, parentheses, and a short list of math functions and constants are accepted. Nothing is ever
passed to ``eval``; names, attributes, subscripts, calls to anything outside the list, strings, comprehensions and
lambdas are refused. Sizes are bounded before they are computed (a power whose result would exceed
``max_int_bits`` bits, a factorial above ``max_factorial``), so ``9**9**9`` costs nothing.

Example::

    calc = Calculator()
    calc("2 * (3 + 4) ** 2")   # '98'
    calc("sqrt(2)")            # '1.41421356237'
    calc("__import__('os')")   # "Error: name '__import__' is not allowed ..."
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

from .base import Tool, ToolOutput

__all__ = ["Calculator", "CalculatorError", "safe_eval"]


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate."""


def _log(x: float, base: float | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


def _round(x: float, ndigits: int | None = None) -> float:
    if ndigits is not None and (not isinstance(ndigits, int) or abs(ndigits) > 100):
        raise CalculatorError("round() digits must be an integer between -100 and 100")
    return round(x) if ndigits is None else round(x, ndigits)


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "log": _log,
    "ln": math.log,
    "log10": math.log10,
    "log2": math.log2,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "floor": math.floor,
    "ceil": math.ceil,
    "factorial": math.factorial,
    "gcd": math.gcd,
    "lcm": math.lcm,
    "radians": math.radians,
    "degrees": math.degrees,
    "hypot": math.hypot,
}

_CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau, "inf": math.inf}

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}

_UNARYOPS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Evaluator:
    def __init__(self, max_int_bits: int, max_factorial: int, max_depth: int):
        self.max_int_bits = max_int_bits
        self.max_factorial = max_factorial
        self.max_depth = max_depth

    def check(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CalculatorError(f"unsupported value of type {type(value).__name__}")
        if isinstance(value, int) and value.bit_length() > self.max_int_bits:
            raise CalculatorError(f"result too large (more than {self.max_int_bits} bits)")
        if isinstance(value, float) and math.isnan(value):
            raise CalculatorError("result is not a number (nan)")
        return value

    def eval(self, node: ast.AST, depth: int = 0) -> Any:
        if depth > self.max_depth:
            raise CalculatorError("expression nested too deeply")
        if isinstance(node, ast.Expression):
            return self.eval(node.body, depth + 1)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise CalculatorError(f"only numbers are allowed, not {type(node.value).__name__} {node.value!r}")
            return self.check(node.value)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
            left = self.eval(node.left, depth + 1)
            right = self.eval(node.right, depth + 1)
            if isinstance(node.op, ast.Pow):
                self._check_pow(left, right)
            elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > self.max_int_bits + 1:
                    raise CalculatorError(f"result too large (more than {self.max_int_bits} bits)")
            return self.check(op(left, right))
        if isinstance(node, ast.UnaryOp):
            op = _UNARYOPS.get(type(node.op))
            if op is None:
                raise CalculatorError(f"operator {type(node.op).__name__} is not allowed")
            return self.check(op(self.eval(node.operand, depth + 1)))
        if isinstance(node, ast.Name):
            if node.id in _CONSTANTS:
                return _CONSTANTS[node.id]
            raise CalculatorError(f"name {node.id!r} is not allowed (constants: {', '.join(sorted(_CONSTANTS))})")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
                what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                raise CalculatorError(f"function {what!r} is not allowed (functions: {', '.join(sorted(_FUNCTIONS))})")
            if node.keywords:
                raise CalculatorError("keyword arguments are not allowed")
            if len(node.args) > 64:
                raise CalculatorError("too many arguments")
            args = [self.eval(arg, depth + 1) for arg in node.args]
            name = node.func.id
            if name == "factorial":
                if len(args) != 1 or not isinstance(args[0], int) or args[0] < 0:
                    raise CalculatorError("factorial() takes one non-negative integer")
                if args[0] > self.max_factorial:
                    raise CalculatorError(f"factorial() argument larger than {self.max_factorial}")
            if name in ("gcd", "lcm") and not all(isinstance(a, int) for a in args):
                raise CalculatorError(f"{name}() takes integers")
            return self.check(_FUNCTIONS[name](*args))
        if isinstance(node, ast.Attribute):
            raise CalculatorError("attribute access is not allowed")
        if isinstance(node, ast.Subscript):
            raise CalculatorError("subscripts are not allowed")
        raise CalculatorError(f"{type(node).__name__} is not allowed in an arithmetic expression")

    def _check_pow(self, base: Any, exponent: Any) -> None:
        if isinstance(base, int) and isinstance(exponent, int):
            if exponent < 0 or abs(base) <= 1:
                return
            if exponent * base.bit_length() > self.max_int_bits + exponent:
                raise CalculatorError(f"result too large (more than {self.max_int_bits} bits)")
        else:
            b, x = abs(float(base)), float(exponent)
            if b not in (0.0, 1.0) and not math.isinf(b) and abs(x * math.log2(b)) > 4096:
                raise CalculatorError("result too large")


def safe_eval(
    expression: str, *, max_int_bits: int = 4096, max_factorial: int = 1000, max_length: int = 2000
) -> int | float:
    """Evaluate an arithmetic expression safely (see the module docstring). Raises :class:`CalculatorError`.

    ``^`` is read as power (``2^10`` is 1024), ``×``/``÷`` as ``*``/``/``; a trailing ``=`` is ignored.
    """
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    text = expression.strip().rstrip("=").strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > max_length:
        raise CalculatorError(f"expression longer than {max_length} characters")
    text = text.replace("^", "**").replace("×", "*").replace("÷", "/").replace("−", "-")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"invalid syntax: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalculatorError("expression could not be parsed") from None
    evaluator = _Evaluator(max_int_bits=max_int_bits, max_factorial=max_factorial, max_depth=200)
    try:
        return evaluator.eval(tree)
    except CalculatorError:
        raise
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("numerical overflow") from None
    except RecursionError:
        raise CalculatorError("expression nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise CalculatorError(str(exc) or type(exc).__name__) from None


def format_number(value: int | float, significant_digits: int = 12) -> str:
    """Integers as is; floats with ``significant_digits`` significant digits (``0.1 + 0.2`` -> ``0.3``),
    integral floats without a fractional part (``6 / 3`` -> ``2``)."""
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.{significant_digits}g}"


class Calculator(Tool):
    """Safe arithmetic as a tool: ``Calculator()("3 * (4 + 5)") == "27"``.

    Args:
        max_int_bits: Largest integer result, in bits (powers and products are checked before computing).
        max_factorial: Largest accepted ``factorial`` argument.
        max_length: Longest accepted expression, in characters.
        significant_digits: Digits shown for non-integral results.

    Bad input returns ``"Error: ..."`` (and ``invoke`` marks it ``error=True``); nothing raises.
    """

    name = "calculator"

    def __init__(
        self,
        *,
        max_int_bits: int = 4096,
        max_factorial: int = 1000,
        max_length: int = 2000,
        significant_digits: int = 12,
    ):
        self.max_int_bits = max_int_bits
        self.max_factorial = max_factorial
        self.max_length = max_length
        self.significant_digits = significant_digits

    def invoke(self, text: str) -> ToolOutput:
        try:
            value = safe_eval(
                text, max_int_bits=self.max_int_bits, max_factorial=self.max_factorial, max_length=self.max_length
            )
        except CalculatorError as exc:
            return ToolOutput(observation=f"Error: {exc}", error=True)
        except Exception as exc:  # noqa: BLE001 - never raise into the rollout
            return ToolOutput(observation=f"Error: {type(exc).__name__}: {exc}", error=True)
        return ToolOutput(observation=format_number(value, self.significant_digits))
