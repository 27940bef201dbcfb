"""The hardware: GPU or CPU, the package versions, and the memory bandwidth behind the decode ceiling."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from measure.benchmarking import (
    Progress,
)


def _nvidia_smi(fields: str) -> list[str] | None:
    binary = shutil.which("nvidia-smi")
    if not binary:
        return None
    try:
        out = subprocess.run(
            [binary, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[:1]
    return [v.strip() for v in first[0].split(",")] if first else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def hardware(engine: dict) -> dict[str, Any]:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu = engine.get("device") == "cuda"
    smi = _nvidia_smi("driver_version") if gpu else None
    return {
        "device": engine.get("device") or "cpu",
        "device_name": engine.get("device_name") if gpu else f"CPU ({_cpu_name()})",
        "device_count": engine.get("device_count") or 1,
        # A CPU engine's device is the machine's memory, of which the KV cache has its configured share.
        "device_memory_bytes": engine.get("device_memory_bytes") if gpu else ram,
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "ram_bytes": ram,
        "driver": smi[0] if smi else None,
        "cuda": engine.get("driver") if gpu else None,
        "vllm": engine.get("vllm_version") or _version("vllm"),
        "torch": engine.get("torch_version") or _version("torch"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _memory_bandwidth(given_gbs: float | None, engine: dict, progress: Progress) -> tuple[float | None, str]:
    """Bytes per second the device's memory delivers, and where the figure comes from."""
    if given_gbs:
        return given_gbs * 1e9, "given with --memory-bandwidth-gbs"
    if engine.get("device") == "cuda":
        # The engine holds the GPU; its theoretical peak from NVML (memory clock x bus width, two
        # transfers a clock) rather than a copy that would need memory the engine has taken.
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
            clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
            return clock_mhz * 1e6 * 2 * bus_bits / 8, f"NVML: {clock_mhz} MHz x {bus_bits} bits x 2 (theoretical peak)"
        except Exception:  # noqa: BLE001 -- no NVML: say so on the sheet
            return None, "unknown (no NVML; pass --memory-bandwidth-gbs)"
    import torch

    # 1 GiB: far larger than any CPU's caches, so the copy measures the memory.
    progress("measuring the memory bandwidth (copies of 1 GiB)")
    size = 1024**3
    source = torch.empty(size, dtype=torch.uint8)
    source.fill_(1)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * size / best, "measured: the best of 5 copies of 1 GiB (read + write)"
