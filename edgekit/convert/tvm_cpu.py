"""The CPU a TVM tuning database was tuned on, and how it compares with the CPU a build or a run is for.

Database lookup matches a workload on its TIR alone, so it is just as blind to the CPU within
one architecture: a schedule's tile sizes, vector width and loop order were chosen by
timing candidates on one particular CPU, for its vector registers and its cache sizes.
Applied on a CPU with wider vectors (AVX-512), int8/bf16 matrix units (VNNI, AMX) or
other caches, the same schedule is valid code but not the fast one for it: on a CPU with
AVX-512 and VNNI the shipped AMD EPYC (AVX2) schedules gave a tvm-fp32 library of 16.7 ms
p50, against 1.1-3 ms for the other runtimes on the same machine.  So every database records
the CPU it was tuned on (``tuned_on_cpu`` in ``tuning.json``: model name, architecture and
its notable instruction-set flags, :mod:`edgekit.core.cpu`), and :func:`schedule_note` compares
it with the CPU the artifact is for: the target's ``mcpu``/``mattr`` and, when the target
is the build host's architecture, the build host's own flags.  A difference goes into the
artifact's notes (``schedules``), which ``edgekit inspect`` shows, and ``edgekit bench``
compares the record with the CPU it measures on (:func:`runtime_caveat`).  Only the flags
are compared: two CPUs with the same ones but other caches are not told apart.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgekit.convert.tvm_database import TuningDatabase, target_arch, target_key
from edgekit.core.cpu import NOTABLE, CpuFeatures, target_flags, this_cpu

RETUNE = "tune on the device (edgekit build --tune-trials N)"


def cpu_record(cpu: CpuFeatures | None = None, model: str | None = None) -> dict[str, Any]:
    """What ``tuning.json`` says about the CPU a database was tuned on (``tuned_on_cpu``): this one by default."""
    cpu = cpu or this_cpu()
    return {
        "model": model if model is not None else _cpu_name(),
        "arch": cpu.arch,
        "flags": list(cpu.notable),
    }


def _recorded(record: Any) -> tuple[str, CpuFeatures] | None:
    """A ``tuned_on_cpu`` record as (model name, features), or ``None`` when absent or malformed."""
    if not isinstance(record, Mapping) or not isinstance(record.get("flags"), list) or not record.get("arch"):
        return None
    return str(record.get("model") or "an unnamed CPU"), CpuFeatures(
        str(record["arch"]), frozenset(str(f) for f in record["flags"])
    )


def _flag_list(flags: frozenset[str] | set[str], arch: str) -> str:
    """Flags in :data:`edgekit.core.cpu.NOTABLE` order (then any others, sorted)."""
    order = NOTABLE.get(arch, ())
    known = [f for f in order if f in flags]
    return ", ".join(known + sorted(f for f in flags if f not in order)) or "none of note"


def _describe(model: str, cpu: CpuFeatures) -> str:
    """``AMD EPYC (x86_64: sse4_2, avx, fma, avx2)``."""
    return f"{model} ({cpu.arch}: {_flag_list(cpu.flags, cpu.arch)})"


def _differences(
    tuned: CpuFeatures, other: frozenset[str], symmetric: bool
) -> tuple[frozenset[str], frozenset[str]]:
    """(flags ``other`` has that the tuning CPU lacked, flags it lacks that the tuning CPU had)."""
    notable = frozenset(NOTABLE.get(tuned.arch, ())) or tuned.flags | other
    more = (other - tuned.flags) & notable
    fewer = (tuned.flags - other) & notable if symmetric else frozenset()
    return frozenset(more), frozenset(fewer)


def _has_lacks(more: frozenset[str], fewer: frozenset[str], arch: str) -> str:
    parts = ([f"has {_flag_list(more, arch)}"] if more else []) + (
        [f"lacks {_flag_list(fewer, arch)}"] if fewer else []
    )
    return "; ".join(parts)


def schedule_note(
    db: TuningDatabase,
    target: Mapping[str, Any],
    cpu: CpuFeatures | None = None,
    cpu_name: str | None = None,
) -> str | None:
    """A sentence for the notes when ``db`` was not tuned on the CPU the build is for, else ``None``.

    Compared: the target key (``mcpu``) it was tuned for; the flags of the CPU it was tuned
    on (``tuned_on_cpu``) against those the target compiles for (``mcpu``/``mattr``: any
    flag the target has that the tuning CPU lacked) and, when the target is ``cpu``'s
    architecture, against ``cpu``'s own flags (any difference): ``cpu`` is the build
    host, this machine's CPU (:func:`edgekit.core.cpu.this_cpu`) unless given, named
    ``cpu_name``.  A database without the record says it was tuned on an unrecorded CPU.
    """
    key = target_key(target)
    recorded = _recorded(db.meta.get("tuned_on_cpu"))
    if db.tuned_on != key:
        on = f"; measured on {_describe(*recorded)}" if recorded else "; measured on an unrecorded CPU"
        if db.arch == target_arch(target):
            return f"schedules tuned on {db.tuned_on}, not on {key}: re-tune on the device for its best speed{on}"
        return (
            f"schedules tuned on {db.arch} ({db.tuned_on}), not on this CPU ({key}): a fallback that beats "
            f"untuned code but is not tuned for it; tune on a {target_arch(target)} machine for its best speed{on}"
        )
    if recorded is None:
        host = db.meta.get("host")
        named = (
            f" (tuning.json names the host {host['cpu']!r} but not its flags)"
            if isinstance(host, Mapping) and host.get("cpu")
            else ""
        )
        return (
            f"schedules tuned on an unrecorded CPU{named}: whether they suit this CPU is unknown; "
            f"if TVM is slow, {RETUNE}"
        )
    model, tuned = recorded
    arch = target_arch(target)
    found: list[str] = []
    wanted = target_flags(target)
    if wanted is not None and tuned.arch == arch:
        more, _ = _differences(tuned, wanted, symmetric=False)
        if more:
            found.append(f"the target ({key}) {_has_lacks(more, frozenset(), arch)}")
    cpu = cpu or this_cpu()
    if cpu.arch == arch:
        more, fewer = _differences(tuned, cpu.flags, symmetric=True)
        if more or fewer:
            name = cpu_name if cpu_name is not None else (_cpu_name() if cpu == this_cpu() else "")
            found.append(
                f"the build host's CPU{f' ({name})' if name else ''} {_has_lacks(more, fewer, arch)}"
            )
    if not found:
        return None
    return (
        f"schedules tuned on another CPU: {_describe(model, tuned)}, "
        f"{'; '.join(found)}: expect slower than tuned; {RETUNE}"
    )


def runtime_caveat(notes: Mapping[str, Any], cpu: CpuFeatures) -> str | None:
    """What to say next to a TVM artifact's timings measured on ``cpu``, from the artifact's notes; ``None``: nothing.

    For ``edgekit bench``: the artifact's schedules were tuned on the CPU in its notes
    (``schedules_tuned_on_cpu``, written by :func:`edgekit.convert.tvm.compile_onnx`); on a
    CPU with other flags its timings are not what the tuned schedules can do.
    """
    if "tuning_database" in notes and notes["tuning_database"] is None:
        return "untuned schedules: plain loops, tens of times slower than tuned code"
    if "tuning_database" not in notes and "schedules_tuned_on" not in notes:
        return None  # not a TVM build's notes
    recorded = _recorded(notes.get("schedules_tuned_on_cpu"))
    if recorded is None:
        return "schedules tuned on an unrecorded CPU: may not suit this one"
    model, tuned = recorded
    if tuned.arch != cpu.arch:
        return f"schedules tuned on another CPU ({model}, {tuned.arch}), not on this {cpu.arch} one"
    more, fewer = _differences(tuned, cpu.flags, symmetric=True)
    if not (more or fewer):
        return None
    return (
        f"schedules tuned on another CPU ({model}: {_flag_list(tuned.flags, tuned.arch)}; "
        f"this one {_has_lacks(more, fewer, cpu.arch)})"
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
