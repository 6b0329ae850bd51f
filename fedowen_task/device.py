"""Where torch work runs: the ``device`` key (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

One resolver for both apps: the ClientApp trains and evaluates there, the ServerApp values
and evaluates there. ``auto`` is CUDA where torch sees a GPU, else the CPU; a named CUDA
device that this machine lacks is a problem at start, naming the key, not a crash in round 1.
"""

from __future__ import annotations

import re

import torch

#: The accepted spellings (``cuda:N``: the N-th GPU).
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_problems(device: str, *, key: str = "device") -> list[str]:
    """Why ``device`` cannot be used on this machine (empty when it can)."""
    if not DEVICE_PATTERN.fullmatch(device):
        return [f"{key}={device!r} is not one of auto, cpu, cuda, cuda:N"]
    if not device.startswith("cuda"):
        return []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= count:
        seen = f"{count} CUDA device(s)" if count else "no CUDA device"
        return [f"{key}={device!r}: torch sees {seen} on this machine; use {key}=\"auto\" "
                "(the GPU where there is one, else the CPU) or \"cpu\""]
    return []


def resolve(device: str) -> torch.device:
    """``device`` as a torch device (``auto``: ``cuda`` when available, else ``cpu``)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
