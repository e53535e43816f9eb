"""A pytest plugin: each failure's traceback appended to the file `VELO_TEST_FAILURES` names,
as soon as the test fails.

pytest prints tracebacks in its summary, at the end of the run. The GPU machine's suite runs
in shards that the end of a lease can cut off before that (`benchmarks/device/device_suite.sh`),
and then only the names of the failures are known. Nothing is written when the variable is
not set."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("VELO_TEST_FAILURES")
    if not path or not report.failed:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
