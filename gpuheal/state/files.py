"""Names of the files in the state directory, in one place.

Public (contract "State directory"): the spec's "Maintains" objects, keyed by alias, plus the
audit trail. Internal: everything else (shapes documented where they are written). A rule's remedy
that keeps a record of its own declares its file (``REMEDY.state_file``: Rule 2's ``vram-onset.json``).
"""

GPU_HEALTH = "gpu-health.json"
VRAM_TREND = "vram-trend.json"
BENCHMARK_REGRESSION = "benchmark-regression.json"
CIRCUIT_BREAKER_STATUS = "circuit-breaker-status.json"
AUDIT_LOG = "gpu-self-heal-log.jsonl"

HISTORY = "history.json"          # state/history_store.py: names the tiers' files, indexes the coarse one
HISTORY_RAW = "history-raw.bin"   # state/history.py: the raw tier (float64 columns, not JSON)
HISTORY_COARSE = "history-coarse.json"  # state/history.py: the coarse tier's open part (a day at most)
HISTORY_COARSE_PART = "history-coarse-{day}{n}.json"  # state/history_store.py: a closed part (day YYYYMMDD, n "" or -N)
HISTORY_COARSE_PARTS = r"history-coarse-(\d{8})(?:-(\d+))?\.json"  # ... their names (a regular expression)
# prometheus-trend.json: a source's own memory is named in its declaration (source_kinds/prometheus.py)
ISSUES = "issues.json"            # core/engine.py: the issue book (steps/book.py: less its log)
ISSUES_LOG = "issues-log.jsonl"   # steps/book.py: the issue book's log of transitions, appended
HEAL = "heal-state.json"          # steps/heal.py: attempts, restarts, pauses (its run_seq: the old run counter)
BENCH = "bench-results.json"      # benchdata.py
BENCH_INDEX = "bench-index.json"  # state/bench_store.py: what check reads of the results, while they are the same
ALERTS = "alerts.json"            # alerts.py
KG_LOG = "knowledge-graph.jsonl"  # kg.py
WAKE = "wake.json"                # steps/wake.py: the last woken cycle
REBENCH = "rebench.json"          # core/rebench.py: the re-benchmarks asked for (a fix's, a context change's)
KG_STATE = "kg-state.json"        # kg.py: offset into the audit log, undelivered nodes
RUN_IDS = "run-ids.json"          # state/store.py: the run id counter of this UTC day {"day", "n"}
DRAIN = "drain.json"              # actions/drain.py: GPUs drained from LiteLLM's routing (issue 28 item 2)
