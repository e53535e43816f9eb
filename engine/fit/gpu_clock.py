"""The GPU's clocks, for `velo-chat doctor`: the SM clock now, the most it can run at, and a cap
below that.

Decode on a GPU is bound by how fast its SMs step through each token's kernels, so a GPU held
below its top clock decodes slower in proportion, whatever else is right. Some DGX Spark units
run with their clock capped below what the GB10 can do; nothing else on the machine says so,
so doctor reads it (docs/fit.md, "The GPU's clock", has what a cap was seen to cost).

The cap is the applications clock (`clocks.applications.graphics`, what the GPU runs its
graphics and SM clock at under load) where it is below the SM's maximum (`clocks.max.sm`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .machine import nvidia_smi_rows

log = logging.getLogger(__name__)

QUERY = "name,clocks.sm,clocks.max.sm,clocks.applications.graphics"
CAP_COST = "a cap costs up to about a third of decode speed on a GB10 — see docs/fit.md"


@dataclass(frozen=True)
class GpuClocks:
    name: str
    sm: int | None  # MHz now (low when the GPU is idle)
    max_sm: int | None  # MHz, the most the SM clock can run at
    applications: int | None  # MHz, the clock the GPU runs at under load

    @property
    def cap(self) -> int | None:
        """The applications clock where it holds the GPU below its maximum; None otherwise
        (or where either is not reported)."""
        if self.applications and self.max_sm and self.applications < self.max_sm:
            return self.applications
        return None

    def describe(self) -> str:
        """`SM 2100 MHz now, max 3003 MHz, capped at 2200 MHz: a cap costs ...`."""
        parts = [f"SM {_mhz(self.sm)} now", f"max {_mhz(self.max_sm)}"]
        if self.cap is not None:
            return ", ".join(parts) + f", capped at {self.cap} MHz: {CAP_COST}"
        if self.applications is None or self.max_sm is None:
            return ", ".join(parts) + ", cap unknown (nvidia-smi reports no applications clock or maximum)"
        return ", ".join(parts) + ", not capped"

    def to_json(self) -> dict[str, object]:
        return {
            "sm_mhz": self.sm,
            "max_sm_mhz": self.max_sm,
            "applications_mhz": self.applications,
            "cap_mhz": self.cap,
            "summary": self.describe(),
        }


def _mhz(value: int | None) -> str:
    return f"{value} MHz" if value is not None else "unknown"


def _int(value: str) -> int | None:
    """A number of MHz, or None for nvidia-smi's "[N/A]" / "[Not Supported]"."""
    value = value.strip()
    try:
        return int(float(value))
    except ValueError:
        return None


def gpu_clocks(timeout: float = 5.0) -> list[GpuClocks]:
    """The clocks of each GPU nvidia-smi lists (none when it is absent or fails)."""
    return [
        GpuClocks(parts[0], _int(parts[1]), _int(parts[2]), _int(parts[3]))
        for parts in nvidia_smi_rows(QUERY, timeout)
        if len(parts) == 4
    ]
