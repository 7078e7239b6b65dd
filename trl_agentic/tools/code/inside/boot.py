"""Starts a sandbox worker (standard library only): ``python -I -c <this source> <config-json> <name> <source> ...``.

Loads the in-sandbox modules given on the command line (``harden``, ``repl``, ``calls``) without putting them in
``sys.modules`` (a program's own ``import repl`` finds its own), hardens the process, then serves requests.
"""

import json
import sys
import types


def _load(name, source):
    module = types.ModuleType(f"_sandbox_{name}")
    exec(compile(source, f"<sandbox {name}>", "exec"), module.__dict__)
    return module


def _main():
    cfg = json.loads(sys.argv[1])
    sources = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    seccomp = _load("harden", sources["harden"]).harden(cfg)
    # ``calls`` serves unit-test runs only: compiled on first use, not at every start
    _load("repl", sources["repl"]).serve(cfg, seccomp, lambda: _load("calls", sources["calls"]))


_main()
