"""Where and with what a record was made (``provenance``): the code's git commit, torch's
version, the device, and the CPU model and vector kernels that decide the last bits of a CPU
run's numbers; and the peak memory a record's cost names (``peak_memory_mb``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import platform
import subprocess
from functools import cache
from pathlib import Path

import torch

CODE_PATHS = (":(top)pe_bench", ":(top)conf", ":(top)pyproject.toml")


@cache
def git_sha() -> str:
    """The code's git commit, with ``-dirty`` for uncommitted changes to what sets the numbers
    (the package, its configs, its pins; not results or docs, which runs themselves rewrite);
    ``unknown`` outside git."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *CODE_PATHS],
            cwd=here,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("-dirty" if dirty else "")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    threads = torch.get_num_threads()
    plural = "" if threads == 1 else "s"
    return f"cpu ({platform.processor() or platform.machine()}, {threads} thread{plural})"


@cache
def cpu_model() -> str:
    """The CPU's model name: ``model name`` of /proc/cpuinfo (Linux), else the platform's
    processor string, else the machine type (``x86_64``)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    return platform.processor() or platform.machine() or "unknown"


def provenance(device: torch.device) -> dict:
    """Where and with what a record was made. ``cpu_model`` and ``cpu_capability`` (the
    vector kernels ATen dispatches to: ``DEFAULT``, ``AVX2``, ``AVX512``, ...; it follows
    ``ATEN_CPU_CAPABILITY``) name what decides the last bits of a CPU run's numbers: two
    machines of another kind give other numbers (docs/reliability.md#determinism)."""
    return {
        "git_sha": git_sha(),
        "torch": torch.__version__.split("+")[0],
        "device": device.type,
        "hardware": device_name(device),
        "cpu_model": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory measurement (see ``peak_memory_mb``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        with contextlib.suppress(OSError):  # Linux: "5" resets the peak RSS (VmHWM)
            Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory since ``reset_peak_memory``: the CUDA allocator's peak on GPU; on CPU the
    process's peak resident set (Linux ``VmHWM``; elsewhere the peak since the process started)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
