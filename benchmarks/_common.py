"""Helpers shared by the benchmark scripts: machine description, load, timing, output, memory.

Timings on a shared machine drift, so every benchmark reports ratios against a baseline
measured in the same run, repeated in rotating order, and the summary statistic of the
repeats (min or median). :func:`machine_info` and :func:`load_average` go into every JSON file
so a number can be read against the machine and the background load it was taken under.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import shlex
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (``uptime``)."""
    return os.getloadavg()


def machine_info() -> dict[str, Any]:
    """Platform, CPU count, memory, library versions, load and the exact command."""
    import flwr
    import numpy
    import torch

    mem_kib = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "platform": platform.platform(), "python": platform.python_version(),
        "cpu_count": os.cpu_count(), "mem_gib": round(mem_kib / 2**20, 1),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "flwr": flwr.__version__, "numpy": numpy.__version__,
        "load_avg_start": [round(x, 2) for x in load_average()],
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }  # fmt: skip


def summarise(samples: Sequence[float], how: str) -> float:
    """``min`` or ``median`` of timing samples (background load only ever adds time)."""
    if how == "min":
        return min(samples)
    if how == "median":
        return float(statistics.median(samples))
    raise ValueError(f"summary {how!r} unknown; use 'min' or 'median'")


def rotated(items: Sequence[str], r: int) -> list[str]:
    """``items`` rotated by ``r``, so repeat ``r`` starts with a different job."""
    k = r % len(items)
    return [*items[k:], *items[:k]]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``fn()`` took (``perf_counter``) and its result."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; floats as given (format them before)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_outputs(payload: dict[str, Any], table: str, out_json: str | None,
                  out_md: str | None) -> None:
    """Print ``table`` and write the JSON payload (gzip-compressed when ``out_json`` ends in
    ``.gz``: :func:`write_json`) and markdown rows where asked."""
    print(table, flush=True)
    if out_json:
        write_json(Path(out_json), payload)
    if out_md:
        Path(out_md).parent.mkdir(parents=True, exist_ok=True)
        Path(out_md).write_text(table)


def write_json(path: Path, payload: Any, indent: int = 2) -> Path:
    """``payload`` as JSON at ``path``, gzip-compressed (no name or time in its header: the
    same payload gives the same bytes) when ``path`` ends in ``.gz``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (json.dumps(payload, indent=indent) + "\n").encode()
    path.write_bytes(gzip.compress(text, compresslevel=9, mtime=0) if path.suffix == ".gz"
                     else text)
    return path


def read_json(path: Path) -> Any:
    """What :func:`write_json` wrote (gzip-compressed when ``path`` ends in ``.gz``)."""
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)


def _proc_table() -> dict[int, tuple[int, str, int]]:
    """pid -> (parent pid, command name, session id) for every process readable in /proc."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry.name)] = (int(fields[1]), name, int(fields[3]))
    return out


def descendants(roots: Sequence[int]) -> set[int]:
    """``roots`` and all their descendants that are alive now.

    A descendant that leads its own session (``setsid``: the SuperLink, Flower's SuperExec)
    brings every process of that session, also those re-parented to init (Ray's actors are).
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    members: dict[int, list[int]] = {}
    for pid, (ppid, _, sid) in table.items():
        children.setdefault(ppid, []).append(pid)
        members.setdefault(sid, []).append(pid)
    seen, todo = set(), [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
            if table[pid][2] == pid:  # a session leader: its whole session
                todo.extend(members.get(pid, []))
    return seen


def _rss_pss_kib(pid: int) -> tuple[int, int]:
    """Resident set and proportional set size of ``pid`` in KiB (0, 0 if gone)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        try:  # no smaps_rollup: RSS from statm, PSS unknown (count it as RSS)
            with open(f"/proc/{pid}/statm") as fh:
                rss = pss = int(fh.read().split()[1]) * PAGE_KIB
        except OSError:
            pass
    return rss, pss


class TreeMemorySampler:
    """Samples the summed RSS and PSS of process trees every ``interval`` seconds in a thread.

    RSS double-counts pages shared between processes (torch's libraries, Ray's object store);
    PSS splits each shared page among its users, so the PSS sum is the tree's real footprint.
    Short-lived processes between samples are missed; peaks are lower bounds.
    """

    def __init__(self, roots: Callable[[], Sequence[int]], interval: float = 0.5) -> None:
        self.roots = roots
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.peak_by_name: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = time.perf_counter()

    def __enter__(self) -> TreeMemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> dict[str, Any]:
        """Take one sample now and keep it."""
        table = _proc_table()
        pids = descendants(self.roots())
        rss = pss = 0
        by_name: dict[str, int] = {}
        for pid in pids:
            r, p = _rss_pss_kib(pid)
            rss, pss = rss + r, pss + p
            name = table[pid][1] if pid in table else "?"
            by_name[name] = by_name.get(name, 0) + p
        for name, kib in by_name.items():
            self.peak_by_name[name] = max(self.peak_by_name.get(name, 0), kib)
        row = {"t": round(time.perf_counter() - self._t0, 2), "processes": len(pids),
               "rss_mib": rss / 1024, "pss_mib": pss / 1024}
        self.samples.append(row)
        return row

    def peak(self, key: str) -> float:
        """The largest sampled ``rss_mib`` or ``pss_mib`` (0 without samples)."""
        return max((s[key] for s in self.samples), default=0.0)
