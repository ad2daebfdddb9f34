"""edgekit's benchmarks, each run from the repository root as ``python -m benchmarks.<name>``.

cold_start, pipeline_efficiency (tools/perf_report.py runs both), pipeline_budget,
telemetry_overhead, fleet_ingest; ``_harness`` holds what they share.
"""
