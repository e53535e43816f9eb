"""The fit check: the estimate against the machine, a table a person can follow, a verdict, and
the one or two settings that would make a profile fit when it does not."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..config.profile_schema import Profile
from .estimate import CACHE, GPU, RAM, RESERVE, Term, estimate, fmt, n_ctx_of
from .machine import Machine
from .model_facts import ModelFacts, read_facts


@dataclass(frozen=True)
class FitReport:
    profile: str
    facts: ModelFacts
    terms: tuple[Term, ...]
    machine: Machine
    suggestions: tuple[str, ...] = ()

    # -- the sums --------------------------------------------------------------------------------

    @property
    def separate_gpu(self) -> bool:
        """GPU terms go against the GPU's own free memory (a discrete GPU)."""
        return not self.machine.unified and any(t.place == GPU for t in self.terms)

    def _sum(self, places: tuple[str, ...]) -> int:
        return sum(t.bytes for t in self.terms if t.place in places)

    @property
    def ram_needed(self) -> int:
        """RAM needed, the reserve kept free included."""
        places = (RAM,) if self.separate_gpu else (RAM, GPU)
        return self._sum(places) + RESERVE

    @property
    def ram_available(self) -> int:
        return self.machine.mem.available

    @property
    def gpu_needed(self) -> int:
        return self._sum((GPU,)) if self.separate_gpu else 0

    @property
    def gpu_available(self) -> int | None:
        gpu = self.machine.gpu
        return gpu.free if self.separate_gpu and gpu is not None else None

    @property
    def page_cache(self) -> int:
        return self._sum((CACHE,))

    @property
    def margin(self) -> int:
        """What must stay available beside what the load needs: where the GPU shares the RAM,
        running out stalls the machine (`machine.margin_bytes`); 0 elsewhere."""
        return self.machine.margin

    @property
    def in_use(self) -> int:
        """What the rest of the machine holds now (MemTotal - MemAvailable)."""
        mem = self.machine.mem
        return max(mem.total - mem.available, 0)

    @property
    def short(self) -> int:
        """Bytes of RAM missing for the load and the margin (0 when there is enough)."""
        return max(self.ram_needed + self.margin - self.ram_available, 0)

    @property
    def fits(self) -> bool:
        if self.short:
            return False
        avail = self.gpu_available
        return not (self.separate_gpu and avail is not None and self.gpu_needed > avail)

    @property
    def cache_fits(self) -> bool:
        """The lazily read PLE table can stay in the page cache beside everything else."""
        return self.ram_needed + self.page_cache <= self.ram_available

    @property
    def verdict(self) -> str:
        if not self.fits:
            return "does not fit"
        if self.page_cache and not self.cache_fits:
            return "fits, but the PLE table cannot stay in the page cache (decode slows)"
        return "fits"

    # -- for people ------------------------------------------------------------------------------

    def summary(self) -> str:
        """One line: what is needed against what is there (and, where the GPU shares the RAM,
        the margin that must stay free beside it)."""
        if self.margin:
            line = (
                f"{self.profile}: needs {fmt(self.ram_needed)} of RAM and {fmt(self.margin)} left "
                f"free beside it (the GPU shares the RAM: running out stalls the machine), "
                f"{fmt(self.ram_available)} available now"
            )
        else:
            line = f"{self.profile}: needs {fmt(self.ram_needed)} of RAM, {fmt(self.ram_available)} available"
        if self.separate_gpu:
            avail = self.gpu_available
            line += f"; {fmt(self.gpu_needed)} of GPU memory, " + (
                f"{fmt(avail)} free" if avail is not None else "free memory unknown"
            )
        return line

    def table(self) -> str:
        f = self.facts
        shards = f"{len(f.shards)} shards, " if len(f.shards) > 1 else ""
        model = f"{f.path.name} ({shards}{fmt(f.file_bytes)}, {f.architecture})"
        lines = [f"Memory for profile {self.profile!r}: {model}"]
        width = max(len(t.label) for t in self.terms)
        for t in self.terms:
            where = "GPU (unified RAM)" if t.place == GPU and not self.separate_gpu else t.place
            lines.append(f"  {t.label:<{width}}  {where:<17} {fmt(t.bytes):>11}  {t.formula}")
        lines.append("  " + "-" * (width + 32))
        unified_gpu = not self.separate_gpu and any(t.place == GPU for t in self.terms)
        rows = "RAM and GPU rows" if unified_gpu else "RAM rows"
        lines.append(
            f"  {'needed in RAM':<{width}}  {'':<17} {fmt(self.ram_needed):>11}  "
            f"the {rows} + {fmt(RESERVE)} kept free"
        )
        if self.margin:
            lines.append(
                f"  {'margin':<{width}}  {'':<17} {fmt(self.margin):>11}  max(4 GiB, 5% of RAM) "
                "to stay available: the GPU shares the RAM, and running out stalls the machine"
            )
        lines.append(
            f"  {'available':<{width}}  {'':<17} {fmt(self.ram_available):>11}  MemAvailable (/proc/meminfo)"
            + (f"; the rest of the machine uses {fmt(self.in_use)}" if self.margin else "")
        )
        if self.separate_gpu:
            avail = self.gpu_available
            lines.append(
                f"  {'needed on the GPU':<{width}}  {'':<17} {fmt(self.gpu_needed):>11}  the GPU rows"
            )
            shown = fmt(avail) if avail is not None else "unknown"
            gpu = self.machine.gpu
            lines.append(f"  {'GPU free':<{width}}  {'':<17} {shown:>11}  {gpu.name if gpu else ''}")
        if self.page_cache:
            left = self.ram_available - self.ram_needed
            lines.append(
                f"  {'page cache wanted':<{width}}  {'':<17} {fmt(self.page_cache):>11}  "
                f"{fmt(max(left, 0))} left for it after the rest"
            )
        lines.append(f"  verdict: {self.verdict}")
        lines.extend(f"  to fit: {s}" for s in self.suggestions)
        return "\n".join(lines)

    def compact(self) -> str:
        """The table for a narrow dialog: sizes first, no arithmetic (`table()` has it)."""
        lines = [f"Memory for profile {self.profile!r}:"]
        for t in self.terms:
            where = f", {t.place}" if t.place != RAM else ""
            lines.append(f"{fmt(t.bytes):>11}  {t.label}{where}")
        lines.append(f"{fmt(self.ram_needed):>11}  needed in RAM ({fmt(RESERVE)} kept free included)")
        if self.margin:
            lines.append(f"{fmt(self.margin):>11}  margin to stay available (the GPU shares the RAM)")
        lines.append(f"{fmt(self.ram_available):>11}  available (MemAvailable)")
        if self.separate_gpu:
            avail = self.gpu_available
            lines.append(f"{fmt(self.gpu_needed):>11}  needed on the GPU")
            lines.append(f"{fmt(avail) if avail is not None else 'unknown':>11}  free on the GPU")
        lines.append(f"verdict: {self.verdict}")
        lines.extend(f"to fit: {s}" for s in self.suggestions)
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "model": str(self.facts.path),
            "shards": [{"path": str(s.path), "bytes": s.size} for s in self.facts.shards],
            "terms": [t.to_json() for t in self.terms],
            "ram_needed": self.ram_needed,
            "ram_available": self.ram_available,
            "mem_available": self.machine.mem.available,
            "reserve": RESERVE,
            "margin": self.margin,
            "separate_gpu": self.separate_gpu,
            "gpu_needed": self.gpu_needed,
            "gpu_available": self.gpu_available,
            "page_cache": self.page_cache,
            "fits": self.fits,
            "cache_fits": self.cache_fits,
            "verdict": self.verdict,
            "suggestions": list(self.suggestions),
        }


def _report(profile: Profile, facts: ModelFacts, machine: Machine, ple_gpu: bool) -> FitReport:
    gpu = machine.gpu
    terms = estimate(
        profile,
        facts,
        gpu_offload=machine.gpu_offload,
        integrated_gpu=gpu is not None and gpu.integrated,
        ple_gpu=ple_gpu,
    )
    return FitReport(profile.name, facts, tuple(terms), machine)


def ple_gather_on_gpu(profile: Profile, facts: ModelFacts, machine: Machine) -> bool:
    """Whether the load will take the GPU PLE gather (engine/llama/ple_provider.py decides it the same
    way before the load), which moves the token-embedding table to the GPU."""
    m = profile.model
    if not (facts.ple_bytes and machine.gpu_offload and m.n_gpu_layers != 0 and m.ple_gather != "stock"):
        return False
    from ..llama import gguf_file, ple_provider

    # "auto" for "gpu" too: the same decision, without the warning the load itself logs
    return ple_provider.plan("auto", gguf_file.read_header(facts.path), m.n_gpu_layers).mode == "gpu"


def check(profile: Profile, model_path: Path, machine: Machine) -> FitReport:
    """The fit report for `profile` loading `model_path` on `machine` (raises `GGUFError` for a
    missing or bad shard). When it does not fit, the report names what would make it fit."""
    facts = read_facts(model_path)
    ple_gpu = ple_gather_on_gpu(profile, facts, machine)
    report = _report(profile, facts, machine, ple_gpu)
    if report.fits:
        return report
    settings = _suggest(profile, facts, machine, ple_gpu)
    return dataclasses.replace(report, suggestions=(*_free_memory(report), *settings))


def _free_memory(report: FitReport) -> list[str]:
    """Where the GPU shares the RAM and the machine holds enough that closing programs would
    be enough on its own: how much to free."""
    if not report.margin or report.short > report.in_use:
        return []
    return [f"close programs to free {fmt(report.short)} (the rest of the machine uses {fmt(report.in_use)})"]


def _with(profile: Profile, section: str, **changes: object) -> Profile:
    return dataclasses.replace(
        profile, **{section: dataclasses.replace(getattr(profile, section), **changes)}
    )


def _largest(lo: int, hi: int, step: int, ok: Callable[[int], bool]) -> int | None:
    """The largest multiple of `step` in [lo, hi] for which `ok` holds (ok is monotone)."""
    best = None
    a, b = lo // step, hi // step
    while a <= b:
        mid = (a + b) // 2
        if ok(mid * step):
            best, a = mid * step, mid + 1
        else:
            b = mid - 1
    return best


def _suggest(profile: Profile, facts: ModelFacts, machine: Machine, ple_gpu: bool) -> list[str]:
    """Up to two single-setting changes, each enough on its own, cheapest in quality first."""
    found: list[str] = []

    def fits(p: Profile) -> bool:
        return _report(p, facts, machine, ple_gpu).fits

    if facts.ple_bytes and profile.model.lazy_ple != "on" and fits(_with(profile, "model", lazy_ple="on")):
        found.append('model.lazy_ple = "on"')
    cp = profile.checkpoints
    if cp.enabled and cp.ram_budget_mib:
        budget = _largest(
            0, cp.ram_budget_mib - 1, 256, lambda b: fits(_with(profile, "checkpoints", ram_budget_mib=b))
        )
        if budget is not None:
            found.append(f"checkpoints.ram_budget_mib = {budget}")
    n_ctx = n_ctx_of(profile, facts)
    if n_ctx > 1024:
        best = _largest(1024, n_ctx - 1, 1024, lambda n: fits(_with(profile, "context", n_ctx=n)))
        if best is not None:
            found.append(f"context.n_ctx = {best}")
    if machine.gpu_offload and profile.model.n_gpu_layers != 0 and not machine.unified:
        top = facts.n_layer + 1 if profile.model.n_gpu_layers < 0 else profile.model.n_gpu_layers
        ngl = _largest(0, top - 1, 1, lambda n: fits(_with(profile, "model", n_gpu_layers=n)))
        if ngl is not None:
            found.append(f"model.n_gpu_layers = {ngl}")
    if not found and n_ctx > 1024:  # no one setting is enough: the cheapest pair
        base = _with(profile, "model", lazy_ple="on") if facts.ple_bytes else profile
        base = _with(base, "checkpoints", ram_budget_mib=0) if cp.enabled else base
        best = _largest(1024, n_ctx, 1024, lambda n: fits(_with(base, "context", n_ctx=n)))
        if best is not None:
            found.append(
                " and ".join(
                    [s for s, keep in _PAIR_PARTS if keep(profile, facts)] + [f"context.n_ctx = {best}"]
                )
            )
    return found[:2]


_PAIR_PARTS = (
    ('model.lazy_ple = "on"', lambda p, f: bool(f.ple_bytes) and p.model.lazy_ple != "on"),
    (
        "checkpoints.ram_budget_mib = 0",
        lambda p, f: p.checkpoints.enabled and p.checkpoints.ram_budget_mib > 0,
    ),
)
