"""Defaults sized from the machine, for settings the operator leaves unset. Pure: no Django."""

from __future__ import annotations

import os

MIN_INGEST_THREADS = 3  # one extracting, one waiting on the embedder, one writing its passages
MAX_INGEST_THREADS = 8  # past this a batch of 64 passages is full anyway


def ingest_threads(*, cores: int, memory_bytes: int, extraction_memory_bytes: int) -> int:
    """Documents the ingest worker reads at once (its pool of threads). Each thread extracts in a
    sandboxed child of its own while the one embedder embeds the passages of all of them
    together, so: a file per core being read beside the embedder, plus one whose passages are
    being stored; at least ``MIN_INGEST_THREADS``, at most ``MAX_INGEST_THREADS``; and no more
    children than half the memory holds at their limit (``APPLIANCE_EXTRACTION_MEMORY_MB``)."""
    by_cores = min(MAX_INGEST_THREADS, max(MIN_INGEST_THREADS, cores + 1))
    by_memory = max(1, memory_bytes // (2 * max(1, extraction_memory_bytes)))
    return int(min(by_cores, by_memory))


def machine_memory_bytes() -> int:
    """This machine's RAM (also the device of a CPU engine, ``inference.capacity``)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def this_machine(cgroup_memory_max: str = "/sys/fs/cgroup/memory.max") -> tuple[int, int]:
    """(cores this process may run on, bytes of RAM it may use): in a container, its cgroup's
    memory limit when that is lower than the machine's."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    memory = machine_memory_bytes()
    try:
        with open(cgroup_memory_max, encoding="ascii") as handle:
            limit = handle.read().strip()
    except OSError:
        limit = "max"
    if limit.isdigit():
        memory = min(memory, int(limit))
    return cores, memory
