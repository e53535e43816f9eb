"""Measuring: `velo-chat bench` and its sections (threads, load, resume, sessions, attach,
compaction, tool loops: `tools.py`).

Nothing here is needed to chat; it drives the engine through its public surface and its
measurement hooks (`velo_chat.engine.diagnostics`) and reports.
"""

from .attach import ATTACH_LINES, AttachedFile
from .compact import run_compact_bench
from .load import busy_processes, check_load_cgroup
from .remote import run_remote_bench
from .result import BenchResult
from .run import DEFAULT_DECODE_TOKENS, format_table, run_bench
from .spec import with_speculation, workloads
from .spec_source import CopyEditSource, copy_edit_source
from .tools import RunTool, run_tools_bench, template_source, tools_profile, tools_result
from .tools import format_lines as tools_lines

__all__ = [
    "ATTACH_LINES",
    "DEFAULT_DECODE_TOKENS",
    "AttachedFile",
    "BenchResult",
    "CopyEditSource",
    "busy_processes",
    "check_load_cgroup",
    "copy_edit_source",
    "format_table",
    "run_compact_bench",
    "run_bench",
    "run_remote_bench",
    "RunTool",
    "run_tools_bench",
    "template_source",
    "tools_lines",
    "tools_profile",
    "tools_result",
    "with_speculation",
    "workloads",
]
