"""CPU time of a process tree, read from ``/proc``: how the parent enforces a worker's per-block ``cpu_time``.

``RLIMIT_CPU`` cannot do it: a program can raise its soft limit up to the hard one (or ignore ``SIGXCPU``), and the
hard limit can never be raised again for the next block; each child process also has a limit of its own. So the
parent sums ``utime + stime`` (threads included) and ``cutime + cstime`` (children already reaped) over the worker's
launcher and all its descendants (``/proc/<pid>/task/<tid>/children``), and kills the worker when a block has
used more than ``cpu_time`` seconds. Processes that left the tree (a double fork without a PID namespace, in the
fallback) are not counted; they keep the session's hard ``RLIMIT_CPU``.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                kids += [int(kid) for kid in fh.read().split()]
        except (OSError, ValueError):
            continue
    return kids


def _cpu_ticks(pid: int) -> int:
    try:  # os.read rather than open(): this runs at every block, and a file object costs half the time
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            fields = os.read(fd, 4096).rsplit(b")", 1)[1].split()
        finally:
            os.close(fd)
    except (OSError, IndexError):
        return 0
    # after the command name: state is field 3, utime/stime/cutime/cstime are fields 14 to 17
    return sum(int(value) for value in fields[11:15])


class ProcessTree:
    """A process and its descendants, as last seen (:attr:`pids`). ``launcher``: the root only starts the tree
    (bwrap, unshare) and waits; its own CPU time is left out (one file less to read at every block)."""

    def __init__(self, root: int, launcher: bool = False):
        self.root = root
        self.launcher = launcher
        self.pids = [] if launcher else [root]

    def cpu_seconds(self, rescan: bool = True) -> float:
        """CPU seconds used so far by the tree (and the children its processes reaped). ``rescan=False`` reads
        only the processes found by the last scan: about four times cheaper, for a baseline taken at every block
        (a process started since then is counted in full at the next scan, which errs on the strict side)."""
        if not rescan:
            return sum(_cpu_ticks(pid) for pid in self.pids) / _TICKS
        pids, seen, total = [self.root], {self.root}, 0
        while pids:
            pid = pids.pop()
            if pid != self.root or not self.launcher:
                total += _cpu_ticks(pid)
            for kid in _children(pid):
                if kid not in seen:
                    seen.add(kid)
                    pids.append(kid)
        self.pids = [pid for pid in seen if pid != self.root or not self.launcher]
        return total / _TICKS
