"""Unit tests run apart from the program they test (standard library only; runs inside sandbox workers).

Two workers take part. The *program* worker runs the candidate program and then answers :func:`answer` requests
about its globals: look names up, call a function, get an attribute, iterate. The *tests* worker runs each test
with :func:`test_namespace`: the names the test reads from the program become local stand-ins (plain values are
copied, everything else becomes a :class:`Remote` whose calls go to the program worker through the parent). The
program's code never runs in the tests worker, so it cannot reach the asserts, the harness or the reply pipe that
carries the verdict; all it can do is return values.

Only data crosses, as JSON (:func:`encode` / :func:`decode`): ``None``, bools, ints, floats, strings, bytes,
complex numbers, lists, tuples, sets, frozensets, dicts and ranges, subclasses reduced to these base types (a
returned ``int`` subclass that claims to equal everything arrives as a plain ``int``). Any other object stays in
the program worker and is a :class:`Remote` handle in the tests worker, equal only to itself, so an object whose
``__eq__`` always says True never equals an expected value. A list, dict, set or bytearray passed to a program
function gets the function's in-place changes back. What cannot cross: callables or objects the test creates
(passed to the program they raise ``TypeError``), and attribute assignment on program objects.
"""

import ast
import base64
import builtins
import importlib
import numbers
import operator
import sys
import types

_MAX_DEPTH = 100
_BIG_INT_BITS = 12000  # larger ints travel as hex (JSON ints are read back as decimal, limited to 4300 digits)
_MUTABLE = (list, dict, set, bytearray)
# what Remote forwards, done as Python does it on the real object (len() of a generator is a TypeError...)
_METHODS = {
    "__iter__": iter,
    "__next__": next,
    "__len__": len,
    "__getitem__": operator.getitem,
    "__contains__": lambda obj, item: item in obj,
}
_MODULES = frozenset(getattr(sys, "stdlib_module_names", ())) | {"numpy"}


class ProgramError(Exception):
    """An exception raised by the program that has no built-in equivalent (its type name and message)."""


class Remote:
    """A program object seen from the tests worker. Calls, attribute reads, iteration, ``len``, indexing and
    ``in`` are forwarded; comparisons are by identity (two reads of one program object give one ``Remote``)."""

    __slots__ = ("_remote_id", "_remote_type", "_remote_ask")

    def __init__(self, handle, type_name, ask):
        object.__setattr__(self, "_remote_id", handle)
        object.__setattr__(self, "_remote_type", type_name)
        object.__setattr__(self, "_remote_ask", ask)

    def __repr__(self):
        return f"<program object of type {self._remote_type}>"

    def __call__(self, *args, **kwargs):
        return self._remote_ask({"op": "call", "handle": self._remote_id}, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._remote_ask({"op": "getattr", "handle": self._remote_id, "name": name}, (), {})

    def __setattr__(self, name, value):
        raise AttributeError("the program's objects cannot be changed from a test")

    def _method(self, name, *args):
        return self._remote_ask({"op": "method", "handle": self._remote_id, "name": name}, args, {})

    def __iter__(self):
        return self._method("__iter__")

    def __next__(self):
        return self._method("__next__")

    def __len__(self):
        return self._method("__len__")

    def __getitem__(self, key):
        return self._method("__getitem__", key)

    def __contains__(self, item):
        return self._method("__contains__", item)


# -- the codec ---------------------------------------------------------------------------------------------------


def encode(value, handles=None, depth=0):
    """``value`` as JSON data. Objects that are not data become ``{"$handle": n}`` entries of ``handles`` (a
    :class:`_Handles` in the program worker) or, in the tests worker (``handles`` None), are refused unless they
    are :class:`Remote` stand-ins."""
    if depth > _MAX_DEPTH:
        return _handle(value, handles)
    if value is None or isinstance(value, bool):
        return value if value is None else bool(value)
    if isinstance(value, numbers.Integral):  # int and its subclasses, numpy integers...
        number = int(value)
        return {"$int": hex(number)} if number.bit_length() > _BIG_INT_BITS else number
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return {"$complex": [value.real, value.imag]}
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes" if isinstance(value, bytes) else "$bytearray": base64.b64encode(value).decode()}
    if isinstance(value, range):
        return {"$range": [value.start, value.stop, value.step]}
    items = _items(value)
    if items is not None:
        tag, elements = items
        data = [encode(v, handles, depth + 1) for v in elements]
        return data if tag is None else {tag: data}
    if isinstance(value, dict):
        return {"$dict": [[encode(k, handles, depth + 1), encode(v, handles, depth + 1)] for k, v in value.items()]}
    return _handle(value, handles)


def _items(value):
    for kind, tag in ((list, None), (tuple, "$tuple"), (frozenset, "$frozenset"), (set, "$set")):
        if isinstance(value, kind):
            return tag, list(value)
    return None


def _handle(value, handles):
    if isinstance(value, Remote):
        return {"$handle": value._remote_id}
    if handles is None:
        raise TypeError(
            f"a test cannot pass a {type(value).__name__} to the program: only data (numbers, strings, bytes, "
            "lists, tuples, sets, dicts) and the program's own objects can cross"
        )
    return {"$handle": handles.add(value), "type": type(value).__name__}


def decode(data, remote=None, handles=None):
    """The value :func:`encode` encoded: handles become ``remote(id, type_name)`` (tests worker) or the objects of
    ``handles`` (program worker). Raises ``ValueError`` on anything else."""
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if isinstance(data, list):
        return [decode(v, remote, handles) for v in data]
    if not isinstance(data, dict) or len(data) not in (1, 2):
        raise ValueError("malformed value from the other worker")
    if "$handle" in data:
        if handles is not None:
            return handles.get(data["$handle"])
        if remote is None:
            raise ValueError("unexpected object handle")
        return remote(data["$handle"], str(data.get("type", "object")))
    ((tag, payload),) = data.items()
    if tag == "$int":
        return int(payload, 16)
    if tag == "$complex":
        return complex(float(payload[0]), float(payload[1]))
    if tag in ("$bytes", "$bytearray"):
        raw = base64.b64decode(payload.encode())
        return raw if tag == "$bytes" else bytearray(raw)
    if tag == "$range":
        return range(*(int(v) for v in payload))
    if tag == "$dict":
        return {decode(k, remote, handles): decode(v, remote, handles) for k, v in payload}
    kinds = {"$tuple": tuple, "$set": set, "$frozenset": frozenset}
    if tag in kinds:
        return kinds[tag](decode(v, remote, handles) for v in payload)
    raise ValueError(f"unknown value tag {tag!r}")


def _exception(data):
    """The exception the program raised, as the tests worker raises it: the built-in type of that name when there
    is one (``ValueError``, ``StopIteration``...), else :class:`ProgramError`."""
    name, message = str(data.get("type", "Exception")), str(data.get("message", ""))
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls(message)
    return ProgramError(f"{name}: {message}")


# -- the program worker ------------------------------------------------------------------------------------------


class _Handles:
    """The program objects handed out, by number (one number per object, kept alive while the worker lives)."""

    def __init__(self):
        self.objects = []
        self.numbers = {}

    def add(self, value):
        number = self.numbers.get(id(value))
        if number is None:
            number = self.numbers[id(value)] = len(self.objects)
            self.objects.append(value)
        return number

    def get(self, number):
        if not isinstance(number, int) or not 0 <= number < len(self.objects):
            raise ValueError("unknown object handle")
        return self.objects[number]


_HANDLES = _Handles()


def _describe(value):
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    return {"value": encode(value, _HANDLES)}


def answer(question, namespace):
    """The program worker's answer to ``question`` (see :class:`Remote`), computed in the program's globals:
    ``{"value": ...}`` (with ``"args"``/``"kwargs"`` after a call: the mutable arguments as the call left them),
    ``{"names": {...}}`` for a lookup, or ``{"raised": {"type", "message"}}``."""
    op = question.get("op")
    try:
        if op == "lookup":
            names = [name for name in question.get("names", []) if isinstance(name, str) and name in namespace]
            return {"names": {name: _describe(namespace[name]) for name in names}}
        target = _HANDLES.get(question.get("handle"))
        args = decode(question.get("args", []), handles=_HANDLES)
        kwargs = decode(question.get("kwargs", {"$dict": []}), handles=_HANDLES)
        if op == "call":
            result = target(*args, **kwargs)
        elif op == "getattr":
            result = getattr(target, str(question.get("name")))
        elif op == "method" and question.get("name") in _METHODS:
            result = _METHODS[question["name"]](target, *args)
        else:
            raise ValueError(f"unknown question {op!r}")
        reply = {"value": encode(result, _HANDLES)}
        if op == "call":
            reply["args"] = [encode(a, _HANDLES) if isinstance(a, _MUTABLE) else None for a in args]
            reply["kwargs"] = {k: encode(v, _HANDLES) for k, v in kwargs.items() if isinstance(v, _MUTABLE)}
        return reply
    except BaseException as exc:  # noqa: BLE001 - the test decides what an exception means
        return {"raised": {"type": type(exc).__name__, "message": _message(exc)}}


def _message(exc):
    try:
        return str(exc)[:2000]
    except BaseException:  # noqa: BLE001
        return "<message could not be read>"


# -- the tests worker --------------------------------------------------------------------------------------------


class _Asker:
    """Sends questions to the program worker (through the parent) and turns answers into values or exceptions."""

    def __init__(self, rpc):
        self.rpc = rpc
        self.remotes = {}

    def remote(self, handle, type_name):
        if handle not in self.remotes:
            self.remotes[handle] = Remote(handle, type_name, self.ask)
        return self.remotes[handle]

    def ask(self, question, args, kwargs):
        question = dict(question, args=encode(list(args)), kwargs=encode(dict(kwargs)))
        reply = self._reply(self.rpc(question))
        if "raised" in reply:
            raise _exception(reply["raised"])
        for original, new in zip(args, reply.get("args") or []):
            if new is not None:
                _update(original, decode(new, self.remote))
        for key, new in (reply.get("kwargs") or {}).items():
            if key in kwargs:
                _update(kwargs[key], decode(new, self.remote))
        return decode(reply.get("value"), self.remote)

    @staticmethod
    def _reply(reply):
        if not isinstance(reply, dict):
            raise RuntimeError("the program's interpreter sent no answer")
        if "failed" in reply:
            raise RuntimeError(f"the program's interpreter failed: {reply['failed']}")
        return reply


def _update(original, new):
    """Give ``original`` (a list, dict, set or bytearray the test passed) the content the program left in it."""
    if type(original) is not type(new):
        return
    if isinstance(original, (list, bytearray)):
        original[:] = new
    elif isinstance(original, (dict, set)):
        original.clear()
        original.update(new)


def _free_names(tree):
    return sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} - set(dir(builtins)))


def test_namespace(code, rpc):
    """Globals for running test ``code`` in the tests worker: for each name the test reads that the program
    defines, a copy of its value, a :class:`Remote`, or the module of that name imported here (standard library
    and numpy only: a program cannot make this worker import something else, nor hand it its own module object).
    Built-in names are never taken from the program. ``rpc(question) -> answer`` asks the program worker."""
    asker = _Asker(rpc)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        names = _free_names(ast.parse(code))
    except SyntaxError:
        return namespace  # the block reports the syntax error
    found = asker._reply(rpc({"op": "lookup", "names": names})).get("names", {})
    for name, description in found.items():
        if name not in names or not isinstance(description, dict):
            continue
        if "module" in description:
            module = str(description["module"])
            if module.split(".")[0] in _MODULES:
                namespace[name] = importlib.import_module(module)
        elif "value" in description:
            namespace[name] = decode(description["value"], asker.remote)
    return namespace
