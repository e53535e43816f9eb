"""Will the model fit? The memory a profile needs, estimated from the GGUF headers before a load,
set against what the machine has (docs/fit.md).

`model_facts` reads what the estimate needs from the headers of every shard, `estimate` turns it
and the profile into terms (weights by placement, KV cache, recurrent state, compute buffers,
checkpoints, the PLE table), `machine` reads the memory the machine has, `report` decides and
draws the table, and `residency` says how much of a file range is in the page cache.
`memory_guard` keeps the margin free after the load where the GPU shares the RAM, and
`gpu_clock` reads the GPU's clocks for doctor.
"""

from ..scheduling.cpu_group import CpuGroup, neighbours_cores
from ..scheduling.cpu_group import probe as probe_cpu_group
from .sizes import fmt
from .gpu_clock import GpuClocks, gpu_clocks
from .machine import Machine, cpu_flags, gpus, llama_bindings, load_average, margin_bytes, meminfo
from .memory_guard import MemoryGuard, machine_guard
from .machine import probe as probe_machine
from .model_facts import ModelFacts, read_facts
from .report import FitReport
from .report import check as check_profile
from .residency import WARM_BELOW, Residency, resident
from .residency import warm as warm_page_cache
from .weights import X86_64, model_weight_types, weight_rounding

__all__ = [
    # the check
    "FitReport",
    "check_profile",
    "fmt",
    # the machine
    "CpuGroup",
    "GpuClocks",
    "Machine",
    "MemoryGuard",
    "cpu_flags",
    "gpu_clocks",
    "gpus",
    "llama_bindings",
    "load_average",
    "machine_guard",
    "margin_bytes",
    "meminfo",
    "neighbours_cores",
    "probe_cpu_group",
    "probe_machine",
    # the model's files
    "ModelFacts",
    "X86_64",
    "model_weight_types",
    "read_facts",
    "weight_rounding",
    # the page cache
    "WARM_BELOW",
    "Residency",
    "resident",
    "warm_page_cache",
]
