"""Child processes of the benchmarks, and what /proc says about their CPU time and memory."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args``, for a child started with ``cwd=ROOT`` or ``env=child_env()``."""
    return [sys.executable, "-m", module, *args]


def child_env() -> dict[str, str]:
    """This environment, with the repository importable whatever the child's directory."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}" if path else str(ROOT)}


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of one process so far."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """The most memory one process has had resident so far (its high-water mark), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a gunicorn arbiter's workers so far (they are its children)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                total += process_cpu(int(child))
            except FileNotFoundError:  # a worker restarting
                continue
    return total


def thread_cpu(name: str) -> Callable[[], float]:
    """A clock of the CPU time of this process's thread called ``name``."""
    thread = next(t for t in threading.enumerate() if t.name == name)
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    return lambda: time.clock_gettime(clock)


def rss_mb() -> float:
    """This process's resident set size now, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_bytes(root_pid: int) -> int:
    """Resident memory of a process and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total
