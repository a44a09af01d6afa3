"""How the suite runs in parallel (scripts/test.sh: pytest-xdist, `-n N --dist loadfile --no-loadscope-reorder`).

Each test file runs whole on one xdist worker, so its module-scoped workers and models are built once. Two
things shorten the run on a small machine without changing what any test proves:

- The longest files start first (`LONG_FIRST`, measured with `--durations`): the run does not end with one
  long file running alone while the other workers idle. A file missing from the list only starts later.
- The heaviest fault suites share a worker (`ONE_AFTER_ANOTHER`): each starts several worker processes or
  injects CPU, disk and network faults, so two of one group at once would only slow each other down and
  stretch the margins their faults need. Each group runs its files one after another.

The tests of the long files also get `LONG_TIMEOUT_S` before pytest-timeout calls them hung (the suite's 300 s
is for the rest): their work is CPU-bound minutes on a busy 2-core machine (the Triton interpreter's kernel
checks, the soak, the serve bench took 4-5 minutes each beside a parallel run and two busy loops).

Without xdist (`pytest` alone) only the order changes; every file still runs as one block.
"""

from __future__ import annotations

import pytest

# the files that take tens of seconds on 2 cores (worker processes, injected faults, mypy), longest first
# (their tests' total, from `--durations=0` of a parallel run)
LONG_FIRST = (
    "tests/test_serve_bench.py", "tests/benchmarks/test_benchmark_tools.py", "tests/reliability/test_fleet.py",
    "tests/reliability/test_fleet_dns.py", "tests/reliability/test_soak.py", "tests/test_code_quality.py",
    "tests/reliability/test_slow_reader.py", "tests/http/test_openai_sdk.py", "tests/test_retrieval_faults.py",
    "tests/test_retrieval_diagnosis.py", "tests/fastpath/test_fused_sampling.py", "tests/http/test_bad_input.py",
    "tests/reliability/test_drain.py", "tests/reliability/test_full_disk.py", "tests/engine/test_sampling_fidelity.py",
    "tests/engine/test_compile_bundle.py", "tests/engine/test_progressive_startup.py",
    "tests/reliability/test_one_worker_per_directory.py", "tests/integration/test_integration_cli.py",
    "tests/integration/test_integration_security.py", "tests/http/test_official_api.py", "tests/test_readme.py",
    "tests/reliability/test_peer_gone.py", "tests/http/test_listening_page.py", "tests/fastpath/test_fused.py",
    "tests/model/test_synthetic_checkpoint.py", "tests/engine/test_batching.py",
    "tests/reliability/test_peer_bounds.py", "tests/codec/test_resample_reference.py",
    "tests/reliability/test_log_backpressure.py", "tests/engine/test_startup_imports.py",
    "tests/http/test_http_tls.py", "tests/integration/test_integration_bench.py",
    "tests/integration/test_integration_artifacts.py",
)

LONG_TIMEOUT_S = 1200

# groups of files that run one after another on one worker
ONE_AFTER_ANOTHER = {
    "fleet": ("tests/reliability/test_fleet.py", "tests/reliability/test_fleet_dns.py",
              "tests/reliability/test_soak.py"),
    "retrieval faults": ("tests/test_retrieval_faults.py", "tests/test_retrieval_diagnosis.py"),
}
_GROUP_OF = {path: name for name, paths in ONE_AFTER_ANOTHER.items() for path in paths}


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def arrange(items: list[pytest.Item]) -> None:
    """Reorder `items` in place, the files of LONG_FIRST first, in its order (the rest as collected), and give
    their tests LONG_TIMEOUT_S unless a test sets its own."""
    rank = {path: i for i, path in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_file_of(item.nodeid), len(rank)))
    for item in items:
        if _file_of(item.nodeid) in rank and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S))


def make_scheduler(config: pytest.Config, log):
    """xdist's file-at-a-time scheduling, with the files of each ONE_AFTER_ANOTHER group as one unit."""
    from xdist.scheduler import LoadFileScheduling

    class FilesAndGroups(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return _GROUP_OF.get(path, path)

    return FilesAndGroups(config, log)
