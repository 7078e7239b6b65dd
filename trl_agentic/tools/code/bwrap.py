"""The bubblewrap command line of a worker: new namespaces, an empty root with read-only system and Python
directories, private size-limited tmpfs work dirs; the environment is the program's only."""

from __future__ import annotations

import os
import shutil

from .host import minimal_roots, python_dirs
from .launch import LaunchSpec

WORKDIR = "/workdir"
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/mime.types",
    "/etc/fonts",
)
"""What of ``/etc`` a sandbox sees, read-only: the loader's cache, time zone, certificates, MIME types, fonts."""
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""The top-level system folders (links into ``/usr`` on merged-usr systems) a sandbox sees, read-only."""


class Mounts:
    """bwrap arguments for read-only mounts, creating the parent directories each destination needs."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.created: set[str] = {"/"}

    def ensure_parents(self, dest: str) -> None:
        parents = []
        parent = os.path.dirname(dest.rstrip("/"))
        while parent not in self.created and parent not in ("", "/"):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(parents):
            self.args += ["--perms", "0755", "--dir", directory]
            self.created.add(directory)

    def ro_bind(self, src: str, dest: str) -> None:
        self.ensure_parents(dest)
        self.args += ["--ro-bind", src, dest]
        self.created.add(dest)


def _namespace_args() -> list[str]:
    args = [
        shutil.which("bwrap") or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
    ]
    if os.geteuid() == 0:
        # bwrap run by root keeps capabilities; the worker needs these three to drop everything and switch to the
        # sandbox uid before any user code runs (see inside/repl.py, harden()).
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args += ["--unshare-user"]
    return args


def _filesystem_args(spec: LaunchSpec) -> list[str]:
    mounts = Mounts()
    mounts.ro_bind("/usr", "/usr")
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            mounts.args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            mounts.args += ["--ro-bind", link, link]
        mounts.created.add(link)
    for path in ETC_FILES:
        if os.path.exists(path):
            mounts.ro_bind(path, path)
    size = str(spec.tmpfs_bytes)
    # /tmp first: an interpreter that lives under /tmp (a virtualenv in a checkout there) is bound on top of it
    mounts.args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    mounts.created.update({"/proc", "/dev", "/tmp"})
    system_roots = ["/usr", *(p for p in SYSTEM_LINKS if os.path.exists(p))]
    for path in minimal_roots(python_dirs(spec.python), already=system_roots):
        mounts.ro_bind(path, path)
    for src, dest in spec.extra_ro_binds:
        mounts.ro_bind(src, dest)
    mounts.args += ["--perms", "1777", "--size", size, "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    return mounts.args


def bwrap_command(spec: LaunchSpec, interpreter: list[str]) -> tuple[list[str], dict[str, str]]:
    """``bwrap ... -- interpreter`` (the sandbox of one worker, see the docs' isolation table) and the environment
    to start it with. bwrap passes its own environment on, so the program's variables never appear on a command
    line (``--setenv`` would show them in ``/proc/*/cmdline``, to ``ps`` on the host and to the program)."""
    env = dict(spec.env)
    env.update({"HOME": WORKDIR, "TMPDIR": "/tmp", "PWD": WORKDIR})
    # The dynamic loader's variables are meant for the program, not for bwrap itself on the host.
    loader = {key: env.pop(key) for key in list(env) if key.startswith("LD_")}
    setenv = [arg for key, value in loader.items() for arg in ("--setenv", key, value)]
    return _namespace_args() + _filesystem_args(spec) + setenv + ["--"] + interpreter, env
