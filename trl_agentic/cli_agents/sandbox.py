"""Where a CLI agent runs: the bubblewrap command line of one run, or none (:func:`sandbox_prefix`).

Under bubblewrap (``sandbox="bwrap"``, or ``"auto"`` where a probe sandbox starts) the CLI gets:

- new user, PID, IPC, UTS, cgroup and network namespaces: it runs as uid 1000 of a user namespace (no capability
  on the host), sees only its own processes (all of them die with the run: ``--die-with-parent``, and the PID
  namespace ends when its first process does), and has a network of its own with loopback alone;
- the endpoint on that loopback, at the port the trainer's endpoint has, so the base URL the CLI is given is the
  trajectory's own: the launcher relays the port to a Unix socket bound in from the host
  (:mod:`~trl_agentic.cli_agents.relay` carries it on to the endpoint). Nothing else is reachable;
- an empty root with read-only ``/usr`` (and the ``/bin``, ``/lib`` links), the few ``/etc`` files the dynamic
  linker and TLS read, a ``passwd``/``group``/``hosts`` of its own, the Python installation the launcher needs and
  the CLI's installation (``installation``), read-only; its working directory (``/workdir``, read-write, the row's
  files) and its home (``/home/agent``, read-write, scratch); a private ``/tmp``. The checkout, the host's home and
  every other file are absent. Every trajectory sees the same paths, so a group's prompts (which name the working
  directory) are the same.

Without bubblewrap (``sandbox="none"``) the CLI is a plain child process in a session of its own, with a cleared
environment, in its working directory on the host: it can read and write whatever the trainer's user can and reach
any network. The launcher still ends every process it started, and the wall-clock and output bounds hold.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from ..tools.code.bwrap import ETC_FILES, SYSTEM_LINKS, Mounts
from ..tools.code.host import minimal_roots

logger = logging.getLogger(__name__)

WORKDIR = "/workdir"
HOME = "/home/agent"
SOCKET_DIR = "/run/trl-agentic"
UID = 1000
SANDBOXES = ("auto", "bwrap", "none")


class SandboxUnavailable(RuntimeError):
    """``sandbox="bwrap"`` was asked for and bubblewrap does not work here."""


@functools.lru_cache(maxsize=1)
def bwrap_works() -> str | None:
    """``None`` when a bubblewrap sandbox with these namespaces starts here, else why not (probed once)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap (bwrap) is not installed (apt-get install bubblewrap)"
    probe = [exe, *_namespaces(), "--ro-bind", "/usr", "/usr", *_links(), "--", "/usr/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start here: {exc}"
    if done.returncode != 0:
        return f"bubblewrap does not start here: {done.stderr.decode(errors='replace').strip()}"
    return None


def choose_sandbox(sandbox: str) -> bool:
    """Whether runs go under bubblewrap for ``sandbox`` (``"auto"``, ``"bwrap"`` or ``"none"``)."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    if sandbox == "none":
        return False
    reason = bwrap_works()
    if reason is not None and sandbox == "bwrap":
        raise SandboxUnavailable(f"sandbox='bwrap': {reason}; pass sandbox='none' to run the CLI unconfined")
    if reason is not None:
        _warn_unconfined(reason)
    return reason is None


@functools.lru_cache(maxsize=1)
def _warn_unconfined(reason: str) -> None:
    """Say once that ``sandbox="auto"`` found no bubblewrap, and what that leaves open."""
    logger.warning("CLI agents run unconfined (%s): each can read and write what this process's user can and reach "
                   "any network; install bubblewrap, or pass sandbox='none' to choose this", reason)


def _namespaces() -> list[str]:
    return ["--die-with-parent", "--new-session", "--unshare-all", "--uid", str(UID), "--gid", str(UID),
            "--hostname", "sandbox", "--cap-drop", "ALL"]


def _links() -> list[str]:
    args: list[str] = []
    for link in SYSTEM_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
    return args


def write_identity(directory: Path) -> dict[str, Path]:
    """The sandbox's own ``/etc/passwd``, ``/etc/group`` and ``/etc/hosts`` (its user, loopback), written in
    ``directory``; by their paths inside."""
    files = {"/etc/passwd": f"agent:x:{UID}:{UID}:agent:{HOME}:/bin/sh\n",
             "/etc/group": f"agent:x:{UID}:\n",
             "/etc/hosts": "127.0.0.1 localhost\n::1 localhost\n"}
    written = {}
    for inside, text in files.items():
        path = directory / Path(inside).name
        path.write_text(text, encoding="utf-8")
        written[inside] = path
    return written


def sandbox_prefix(workdir: Path, home: Path, socket_dir: Path, identity: dict[str, Path],
                   read_only: Sequence[str]) -> list[str]:
    """``bwrap ... --`` for one run (module docstring): ``workdir`` and ``home`` bound read-write at
    :data:`WORKDIR` and :data:`HOME`, ``socket_dir`` (the endpoint's Unix socket) read-only at :data:`SOCKET_DIR`,
    ``identity`` (:func:`write_identity`) over ``/etc``, and ``read_only`` (the Python installation and the CLI's)
    at their own paths."""
    mounts = Mounts()
    mounts.ro_bind("/usr", "/usr")
    mounts.args += _links()
    mounts.created.update(SYSTEM_LINKS)
    for path in ETC_FILES:
        if os.path.exists(path):
            mounts.ro_bind(path, path)
    for inside, path in identity.items():
        mounts.ro_bind(str(path), inside)
    mounts.args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    mounts.created.update({"/proc", "/dev", "/tmp"})
    system = ["/usr", *(p for p in SYSTEM_LINKS if os.path.exists(p))]
    paths = {form(p) for p in read_only if os.path.exists(p) for form in (os.path.abspath, os.path.realpath)}
    for path in minimal_roots(paths, already=system):
        mounts.ro_bind(path, path)
    mounts.ro_bind(str(socket_dir), SOCKET_DIR)
    for src, dest in ((workdir, WORKDIR), (home, HOME)):
        mounts.ensure_parents(dest)
        mounts.args += ["--bind", str(src), dest]
    return [shutil.which("bwrap") or "bwrap", *_namespaces(), *mounts.args, "--chdir", WORKDIR, "--"]
