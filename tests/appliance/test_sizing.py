"""The ingest pool's size from the machine (pure)."""

from appliance.sizing import MAX_INGEST_THREADS, MIN_INGEST_THREADS, ingest_threads, this_machine

GIB = 1024**3


def test_a_file_per_core_beside_the_embedder_within_bounds():
    assert ingest_threads(cores=2, memory_bytes=24 * GIB, extraction_memory_bytes=2 * GIB) == 3
    assert ingest_threads(cores=4, memory_bytes=64 * GIB, extraction_memory_bytes=2 * GIB) == 5
    assert ingest_threads(cores=1, memory_bytes=64 * GIB, extraction_memory_bytes=2 * GIB) == MIN_INGEST_THREADS
    assert ingest_threads(cores=64, memory_bytes=512 * GIB, extraction_memory_bytes=2 * GIB) == MAX_INGEST_THREADS


def test_memory_caps_the_pool_at_half_of_it_in_extraction_children():
    assert ingest_threads(cores=16, memory_bytes=8 * GIB, extraction_memory_bytes=2 * GIB) == 2
    assert ingest_threads(cores=16, memory_bytes=2 * GIB, extraction_memory_bytes=2 * GIB) == 1


def test_a_containers_memory_limit_counts_when_lower_than_the_machines(tmp_path):
    limit = tmp_path / "memory.max"
    limit.write_text("4294967296\n")
    cores, memory = this_machine(str(limit))
    assert cores >= 1 and memory == 4 * GIB
    limit.write_text("max\n")
    assert this_machine(str(limit))[1] == this_machine("/nonexistent")[1]  # no limit: the machine's RAM
