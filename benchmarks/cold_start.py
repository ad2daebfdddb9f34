"""Cold start and peak memory: fresh processes from interpreter start to the first label, per artifact.

Each run is a new Python process that does what a device application does and nothing
else: ``import edgekit``, ``edgekit.load(bundle)``, open a source and classify its first
frame, then run ``--frames`` more frames through a ``Pipeline`` (so the memory figure is
the steady state, not just the first call).  Definitions (what ``edgekit bench`` reports):

- **cold start**: from just before the parent spawns the process (``CLOCK_MONOTONIC``,
  which every process on Linux shares) to the moment the first frame's labels exist.
  Files are in the page cache (warm disk): a first boot reads them from storage too.
- **breakdown**: ``interp`` (spawn to the child's first statement: Python and ``site``),
  ``import`` (``import edgekit``), ``Model.load_ms`` from inside ``edgekit.load``
  (``imports``, ``verify``, ``profile``, ``session``: a runtime's import counts in the
  phase that triggers it), ``first`` (open the source, read a 640x480 frame, classify it).
- **peak RSS**: the child's ``VmHWM`` after the first label and after the pipeline frames;
  the parent's ``ru_maxrss`` for that child (``os.wait4``) as a cross-check.

Artifacts take turns, run after run, so a noisy shared machine slows all of them alike.
One artifact is chosen by a generated device profile with that one candidate (so no host
detection); ``auto`` is ``edgekit.load(bundle)`` as ``edgekit run`` does it, detection
included.  ``--imports`` adds one ``python -X importtime`` run per artifact and lists the
top-level imports that cost most.

    .venv/bin/python -m benchmarks.cold_start [BUNDLE] [--artifacts auto,onnxruntime-int8] [--runs 5]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks._harness import bundle_of, parse, parser, print_json, run
from edgekit.core.stats import median

if TYPE_CHECKING:
    from edgekit.bundle.manifest import ArtifactEntry
    from edgekit.device.profiles import DeviceProfile

# The child: nothing but what a device needs.  Timestamps are CLOCK_MONOTONIC in ns.
CHILD = r"""
import time
T_START = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
import json, sys
import edgekit
T_IMPORT = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
model = edgekit.load(sys.argv[1], device=sys.argv[2])
T_LOAD = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
source = edgekit.open_source("synthetic:640x480@0")
labels = model.classify(source.read())
T_FIRST = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
CPU_FIRST = time.process_time()
source.close()

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
rss_first = hwm()
frames = int(sys.argv[3])
if frames:
    edgekit.Pipeline(model, "synthetic:640x480@0", frames=frames).run()
print(json.dumps({
    "start": T_START, "import": T_IMPORT, "load": T_LOAD, "first": T_FIRST, "cpu_first_s": CPU_FIRST,
    "load_ms": dict(getattr(model, "load_ms", {})), "candidate": model.candidate, "top": labels[0].name,
    "rss_first_mb": rss_first, "rss_mb": hwm(),
    "modules": sorted({m.split(".")[0] for m in sys.modules}),
}))
model.close()
"""

# Top-level packages worth naming when they show up in a device process.
HEAVY = (
    "openvino",
    "tvm",
    "ai_edge_litert",
    "tflite_runtime",
    "torch",
    "tensorrt",
    "pydantic",
    "cryptography",
)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def write_profile(folder: Path, host: DeviceProfile, artifact: ArtifactEntry) -> str:
    """A copy of this host's profile whose only candidate is ``artifact`` (options from the host's)."""
    data = host.to_dict()
    same = [c for c in host.candidates if (c.backend, c.precision) == (artifact.backend, artifact.precision)]
    name = f"bench-{artifact.name}"
    lines = [f"name = {_toml(name)}"]
    lines += [
        f"{k} = {_toml(data[k])}"
        for k in ("description", "arch", "cpu", "budget_ms", "camera", "runtime_packages")
    ]
    lines += ["[tvm_target]", *(f"{k} = {_toml(v)}" for k, v in data["tvm_target"].items())]
    lines += [
        "[[candidates]]",
        f"backend = {_toml(artifact.backend)}",
        f"precision = {_toml(artifact.precision)}",
    ]
    if same and same[0].options:
        lines.append(f"options = {_toml(data['candidates'][host.candidates.index(same[0])]['options'])}")
    (folder / f"{name}.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return name


def run_child(bundle: Path, device: str, frames: int, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryFile() as err:
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(bundle), device, str(frames)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=env,
            cwd="/",  # not the checkout: sys.path[0] is the working directory under -c
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.stdout.close()
        # wait4, not wait: it also returns this child's own resource usage (ru_maxrss).
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(
                f"the child for {device} failed ({proc.returncode}):\n{err.read().decode()[-3000:]}"
            )
    r: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])

    def ms(a: int, b: int) -> float:
        return (b - a) / 1e6

    r["cold_ms"] = ms(t0, r["first"])
    r["phases"] = {
        "interp": ms(t0, r["start"]),
        "import": ms(r["start"], r["import"]),
        **{f"load.{k}": v for k, v in r["load_ms"].items()},
        "first": ms(r["load"], r["first"]),
    }
    r["maxrss_mb"] = usage.ru_maxrss / 1024
    return r


def import_costs(bundle: Path, device: str, env: dict[str, str], top: int = 8) -> list[tuple[str, float]]:
    """The top-level imports of one child run by cumulative ms (``python -X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", CHILD, str(bundle), device, "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=True,
    )
    # Each module's own time (``self``) is charged to its top-level package: numpy imported by
    # edgekit counts as numpy, and the package costs add up to the whole import time.
    costs: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        own, _, name = line[len("import time:") :].split("|")
        pkg = name.strip().split(".")[0]
        costs[pkg] = costs.get(pkg, 0.0) + int(own) / 1000
    return sorted(costs.items(), key=lambda kv: -kv[1])[:top]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__, bundle=True, device=False, json_flag=True)
    ap.add_argument(
        "--artifacts",
        default="auto,onnxruntime-fp32,onnxruntime-int8",
        help="comma-separated artifact names of the bundle, 'auto' (edgekit.load's own choice), or 'all'",
    )
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per artifact")
    ap.add_argument("--frames", type=int, default=30, help="pipeline frames after the first label (for RSS)")
    ap.add_argument("--imports", action="store_true", help="also list the costliest imports per artifact")
    ap.add_argument(
        "--compare",
        type=Path,
        metavar="DIR",
        help="another edgekit source tree (e.g. `git archive HEAD edgekit devices` unpacked): "
        "its runs alternate with this tree's, side by side, shown as NAME@DIR",
    )
    args = parse(ap, argv)

    from edgekit.bundle import read_manifest
    from edgekit.core.elf import host_arch
    from edgekit.device.host import match_profile

    bundle = bundle_of(args).resolve()
    manifest = read_manifest(bundle)
    runnable = [a for a in manifest.artifacts if a.arch in ("any", host_arch()) and "edgetpu" not in a.kind]
    wanted = [n.strip() for n in args.artifacts.split(",") if n.strip()]
    if wanted == ["all"]:
        wanted = ["auto", *(a.name for a in runnable)]
    host_profile = match_profile()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="edgekit-cold-") as tmp:
        base = dict(os.environ)
        # The generated profiles are seen only by the runs that name them: 'auto' must not match one.
        named = dict(
            base, EDGEKIT_DEVICES_PATH=os.pathsep.join(filter(None, [tmp, base.get("EDGEKIT_DEVICES_PATH")]))
        )
        devices: dict[str, str] = {}
        for name in wanted:
            if name == "auto":
                devices[name] = "auto"
                continue
            art = next((a for a in runnable if a.name == name), None)
            if art is None:
                raise SystemExit(
                    f"{name}: no such artifact runnable here (have: {', '.join(a.name for a in runnable)})"
                )
            devices[name] = write_profile(Path(tmp), host_profile, art)
        trees: dict[str, dict[str, str]] = {"": {}}
        if args.compare is not None:
            path = os.pathsep.join(filter(None, [str(args.compare.resolve()), base.get("PYTHONPATH")]))
            trees[f"@{args.compare}"] = {"PYTHONPATH": path}

        def env_for(name: str, tree: str) -> dict[str, str]:
            return {**(base if devices[name] == "auto" else named), **trees[tree]}

        for tree in trees:  # untimed: fills the page cache and writes .pyc files
            run_child(bundle, devices[wanted[0]], 0, env_for(wanted[0], tree))
        for _ in range(args.runs):
            for name in wanted:
                for tree in trees:
                    got = run_child(bundle, devices[name], args.frames, env_for(name, tree))
                    results.setdefault(name + tree, []).append(got)
        imports = (
            {
                name + tree: import_costs(bundle, devices[name], env_for(name, tree))
                for name in wanted
                for tree in trees
            }
            if args.imports
            else {}
        )

    summary: dict[str, Any] = {}
    for name, runs in results.items():
        keys = list(dict.fromkeys(k for r in runs for k in r["phases"]))
        phases = {k: median(r["phases"].get(k, 0.0) for r in runs) for k in keys}
        heavy = sorted({m for r in runs for m in r["modules"] if m in HEAVY})
        summary[name] = {
            "candidate": runs[0]["candidate"],
            "cold_start_ms": median(r["cold_ms"] for r in runs),
            "cold_start_ms_all": [round(r["cold_ms"], 1) for r in runs],
            "cpu_to_first_label_ms": median(r["cpu_first_s"] * 1e3 for r in runs),
            "phases_ms": phases,
            "peak_rss_first_mb": median(r["rss_first_mb"] for r in runs),
            "peak_rss_mb": median(r["rss_mb"] for r in runs),
            "maxrss_mb": median(r["maxrss_mb"] for r in runs),
            "heavy_imports": heavy,
            "imports_ms": imports.get(name, []),
        }
    if args.json:
        print_json(
            {"bundle": str(bundle), "runs": args.runs, "frames": args.frames, "results": summary}, indent=2
        )
        return 0
    print(f"{manifest.model.name}: {bundle}; {args.runs} fresh processes each, {args.frames} pipeline frames")
    for name, s in summary.items():
        print(f"\n{name} (runs as {s['candidate']})")
        print(f"  cold start to first label : {s['cold_start_ms']:.0f} ms median  {s['cold_start_ms_all']}")
        print(
            f"  CPU time to first label   : {s['cpu_to_first_label_ms']:.0f} ms (all threads; steadier on a busy machine)"
        )
        print("  breakdown (median ms)     : " + "  ".join(f"{k} {v:.0f}" for k, v in s["phases_ms"].items()))
        print(
            f"  peak RSS                  : {s['peak_rss_first_mb']:.0f} MB at the first label, "
            f"{s['peak_rss_mb']:.0f} MB after {args.frames} frames (ru_maxrss {s['maxrss_mb']:.0f} MB)"
        )
        print(f"  heavy modules imported    : {', '.join(s['heavy_imports']) or 'none'}")
        if s["imports_ms"]:
            print("  costliest imports (ms)    : " + "  ".join(f"{k} {v:.0f}" for k, v in s["imports_ms"]))
    return 0


if __name__ == "__main__":
    run(main)
