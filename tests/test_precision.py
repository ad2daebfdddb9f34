"""Precision is what the artifact says, and int8 fits the CPU it runs on.

CPUs are described by their /proc/cpuinfo flags (fixtures copied from real machines), so
every assertion here holds on any build or CI machine, AVX2-only or AVX-512 with AMX.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.core.cpu import CpuFeatures, parse_cpuinfo, read_cpu
from edgekit.device.host import read_host
from edgekit.device.profiles import Candidate, get_profile, parse_profile, pin_precision
from edgekit.errors import ProfileError
from edgekit.processing.preprocessing import PreprocessSpec
from edgekit.selection.precision import compute_precision, int8_pick

ROOT = Path(__file__).resolve().parents[1]  # benchmarks.int8_kernels runs from the repository root

# The flags lines of real machines (trimmed of flags edgekit does not read).
EPYC_AVX2 = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx fma avx2 bmi2 sha_ni\n"
ZEN4 = (
    "processor\t: 0\nmodel name\t: AMD EPYC 9B14\nflags\t\t: sse4_2 avx fma avx2 avx512f avx512bw avx512vl "
    "avx512_vnni avx512_bf16 avx512vbmi\n"
)
SAPPHIRE_RAPIDS = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: sse4_2 avx fma avx2 avx512f "
    "avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 avx512_fp16 amx_tile amx_int8 amx_bf16\n"
)
ALDER_LAKE = "processor\t: 0\nflags\t\t: sse4_2 avx fma avx2 avx_vnni\n"
CORTEX_A76 = (  # Raspberry Pi 5
    "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
    "asimdrdm lrcpc dcpop asimddp\nCPU part\t: 0xd0b\n"
)
CORTEX_A72 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU part\t: 0xd08\n"  # Pi 4

CPUS = {
    "epyc-avx2": (EPYC_AVX2, "x86_64", ()),
    "zen4": (ZEN4, "x86_64", ("int8-dot", "bf16")),
    "sapphire-rapids": (SAPPHIRE_RAPIDS, "x86_64", ("int8-dot", "bf16", "fp16")),
    "alder-lake": (ALDER_LAKE, "x86_64", ("int8-dot",)),
    "cortex-a76": (CORTEX_A76, "aarch64", ("int8-dot", "fp16")),
    "cortex-a72": (CORTEX_A72, "aarch64", ()),
}


def cpu(name: str) -> CpuFeatures:
    text, arch, _ = CPUS[name]
    return parse_cpuinfo(text, arch)


@pytest.mark.parametrize("name", CPUS)
def test_capabilities_come_from_the_flags(name: str) -> None:
    assert cpu(name).capabilities == CPUS[name][2]


def test_host_carries_the_cpu_from_its_files(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text(CORTEX_A76)
    host = read_host(tmp_path, probe_runtimes=False, arch="aarch64")
    assert host.cpu_capabilities == ("int8-dot", "fp16")
    assert "asimddp" in host.cpu_flags and "evtstrm" not in host.cpu_flags
    assert read_cpu(tmp_path, "aarch64") == cpu("cortex-a76")


# The auxiliary vectors QEMU 7.2 user-mode gives an aarch64 process (AT_HWCAP, AT_HWCAP2) for
# its CPU models; packed as /proc/self/auxv holds them, ending with AT_NULL.
def auxv(hwcap: int, hwcap2: int = 0) -> bytes:
    import struct

    return struct.pack("=6Q", 16, hwcap, 26, hwcap2, 0, 0)


QEMU_A72, QEMU_A76, QEMU_MAX = auxv(0x8FB), auxv(0x119FFB), auxv(0xECFFFFFB, 0x7F877FFF)


@pytest.mark.parametrize(
    ("vector", "capabilities", "flags"),
    [
        (QEMU_A72, (), ("asimd",)),
        (QEMU_A76, ("int8-dot", "fp16"), ("asimd", "asimddp", "fphp", "asimdhp")),
        (
            QEMU_MAX,
            ("int8-dot", "bf16", "fp16"),
            ("asimd", "asimddp", "fphp", "asimdhp", "i8mm", "bf16", "sve", "sve2"),
        ),
    ],
    ids=["cortex-a72", "cortex-a76", "max"],
)
def test_an_arm_cpu_under_emulation_is_read_from_its_auxiliary_vector(
    tmp_path: Path, vector: bytes, capabilities: tuple[str, ...], flags: tuple[str, ...]
) -> None:
    """QEMU user-mode shows an aarch64 process the x86_64 host's /proc/cpuinfo, but its own AT_HWCAP."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/cpuinfo").write_text(SAPPHIRE_RAPIDS)  # the host's, not the emulated CPU's
    (tmp_path / "proc/self/auxv").write_bytes(vector)
    got = read_cpu(tmp_path, "aarch64")
    assert got.capabilities == capabilities
    assert set(got.notable) == set(flags)
    assert read_host(tmp_path, probe_runtimes=False, arch="aarch64").cpu_capabilities == capabilities
    # A cpuinfo that lists the flags wins; x86 reads its own line only.
    (tmp_path / "proc/cpuinfo").write_text(CORTEX_A72)
    assert read_cpu(tmp_path, "aarch64").capabilities == ()
    assert read_cpu(tmp_path, "x86_64").flags == frozenset()


def test_why_names_the_flags_or_what_is_missing() -> None:
    assert cpu("sapphire-rapids").why("int8-dot") == "avx512_vnni, avx_vnni, amx_int8"
    assert "none of avx512_vnni" in cpu("epyc-avx2").why("int8-dot")
    with pytest.raises(ValueError, match="unknown CPU capability"):
        cpu("zen4").has("vnni")


# -- profiles pin the precision --------------------------------------------------------


def test_every_openvino_candidate_computes_in_its_named_precision() -> None:
    for profile in ("x86_64-cpu", "intel-npu"):
        for c in get_profile(profile).candidates:
            if c.backend == "openvino":
                want = {"fp32": "f32", "int8": "f32", "bf16": "bf16", "fp16": "f16"}[c.precision]
                assert c.options["inference_precision"] == want, c.key


def _profile(tmp_path: Path, candidate: dict[str, Any]) -> Any:
    from edgekit.backends import registry

    data = {
        "name": "p",
        "description": "d",
        "arch": "x86_64",
        "cpu": "x",
        "budget_ms": 33.3,
        "camera": "0",
        "runtime_packages": [],
        "tvm_target": {"kind": "llvm"},
        "candidates": [candidate],
    }
    backends = {n: registry.get(n).options for n in registry.names()}
    return parse_profile(tmp_path / "p.toml", data, backends)


def test_a_profile_that_runs_fp32_in_bf16_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"inference_precision.*'bf16'.*fp32 candidate computes in 'f32'"):
        _profile(tmp_path, {"backend": "openvino", "options": {"inference_precision": "bf16"}})
    ok = _profile(tmp_path, {"backend": "openvino", "precision": "bf16", "requires": ["bf16"]})
    assert ok.candidates[0].options["inference_precision"] == "bf16"
    assert ok.candidates[0].key == "openvino-bf16"


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [("requires", ["vnni"], "must be one of int8-dot"), ("variant", "Full Range", "letters, digits")],
)
def test_variant_and_requires_are_checked(tmp_path: Path, field: str, value: Any, problem: str) -> None:
    with pytest.raises(ProfileError, match=problem):
        _profile(tmp_path, {"backend": "onnxruntime", "precision": "int8", field: value})


def test_pin_leaves_other_backends_alone() -> None:
    assert pin_precision("onnxruntime", "fp32", {"spin": True}) == {"spin": True}
    assert pin_precision("openvino", "int8", {}) == {"inference_precision": "f32"}


# -- what each candidate computes in, and which int8 a CPU takes ------------------------


def test_compute_precision_says_what_runs() -> None:
    x86 = {c.key: c for c in get_profile("x86_64-cpu").candidates}
    spr, epyc = cpu("sapphire-rapids"), cpu("epyc-avx2")
    assert compute_precision(x86["openvino-fp32"], spr) == "fp32"
    assert compute_precision(x86["openvino-bf16"], spr) == "bf16"
    assert compute_precision(x86["openvino-bf16"], epyc).startswith("fp32 (no bf16")
    assert compute_precision(x86["onnxruntime-int8"], epyc) == "int8 (7-bit weights)"
    assert "saturate" in compute_precision(x86["onnxruntime-int8-full"], epyc)
    assert compute_precision(x86["onnxruntime-int8-full"], spr) == "int8 (full-range weights)"
    npu = get_profile("intel-npu").candidates[0]
    assert compute_precision(npu, spr) == "fp16 (the NPU's own)"


@pytest.mark.parametrize(
    ("name", "picked", "why"),
    [
        ("sapphire-rapids", "openvino-int8-full", "int8-dot (avx512_vnni"),
        ("zen4", "openvino-int8-full", "int8-dot (avx512_vnni"),
        ("alder-lake", "openvino-int8-full", "int8-dot (avx_vnni"),
        ("epyc-avx2", "onnxruntime-int8", "portable recipe (7-bit weights)"),
    ],
)
def test_the_cpu_picks_the_int8_recipe(name: str, picked: str, why: str) -> None:
    cand, reason = int8_pick(get_profile("x86_64-cpu").candidates, cpu(name))
    assert cand is not None and cand.key == picked
    assert why in reason


def test_arm_takes_full_range_int8_with_or_without_the_dot_product() -> None:
    # Arm kernels widen products to 16 bits and pair-add in 32: nothing saturates on any core.
    cand = next(
        c for c in get_profile("rpi5").candidates if c.precision == "int8" and c.backend == "onnxruntime"
    )
    assert cand.variant == "full" and not cand.missing(cpu("cortex-a72"))


def test_selection_refuses_a_candidate_the_cpu_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import edgekit.selection.plan as selection

    full = Candidate("onnxruntime", "int8", {}, variant="full", requires=("int8-dot",))
    monkeypatch.setattr(selection, "this_cpu", lambda: cpu("epyc-avx2"))
    avail = selection.backend_availability(full)
    assert not avail.ok and "needs int8-dot" in avail.reason and "avx512_vnni" in avail.reason
    monkeypatch.setattr(selection, "this_cpu", lambda: cpu("zen4"))
    assert selection.backend_availability(full).ok


# -- the runtimes: what they really compute in -----------------------------------------


def test_openvino_fp32_compiles_to_f32_on_any_cpu(tiny: Any) -> None:
    """The CPU plugin's default is bf16 on AVX512-BF16/AMX CPUs and f16 on Armv8.2: edgekit pins f32."""
    pytest.importorskip("openvino")
    from edgekit.backends import open_session

    with open_session(tiny.openvino_ir, "openvino") as s:
        assert s.compute_precision == "f32"
        out = s.run(tiny.input_nchw)[0]
    np.testing.assert_allclose(out, tiny.expected, atol=1e-4)


def test_reference_openvino_fp32_agrees_with_onnxruntime_fp32(
    x86_bundle: tuple[Path, dict[str, Any]],
) -> None:
    """The reference model's fp32 IR within 1e-3 of ONNX Runtime fp32 in logits (bf16 is ~0.5 off)."""
    pytest.importorskip("openvino")
    from edgekit.backends import open_session
    from edgekit.bundle import read_manifest
    from edgekit.convert.images import smoke_set

    bundle, _ = x86_bundle
    m = read_manifest(bundle)
    path = {a.name: bundle / a.path for a in m.artifacts}
    batch = smoke_set().batch(PreprocessSpec.from_manifest(m))[:6]
    with open_session(path["openvino-fp32"], "openvino") as ov, open_session(path["onnxruntime-fp32"]) as ort:
        assert ov.compute_precision == "f32"
        for x in batch:
            a, b = ov.run(x[None])[0], ort.run(x[None])[0]
            assert np.abs(a - b).max() < 1e-3


def test_the_x86_bundle_carries_both_int8_recipes_and_bf16(x86_bundle: tuple[Path, dict[str, Any]]) -> None:
    """Each artifact is gated, or says why not: only a CPU lacking what it needs leaves it to the device."""
    from edgekit.bundle import read_manifest
    from edgekit.convert.gate import host_gap
    from edgekit.core.cpu import this_cpu

    bundle, summary = x86_bundle
    arts = {a.name: a for a in read_manifest(bundle).artifacts}
    assert arts["onnxruntime-int8-full"].requires == ("int8-dot",)
    assert arts["openvino-int8-full"].requires == ("int8-dot",)
    assert arts["openvino-bf16"].requires == ("bf16",)
    assert arts["onnxruntime-int8"].requires == () and arts["onnxruntime-int8"].variant == ""
    assert "7-bit" in arts["onnxruntime-int8"].notes["weights"]
    assert "full 8-bit" in arts["onnxruntime-int8-full"].notes["weights"]
    here = this_cpu()
    reports = {r["path"]: r for r in summary["artifacts"] if r["path"]}
    for a in arts.values():
        # The builder's own rule (its gate's): gated where this host computes it as the device will.
        gap = host_gap(a, here)
        if gap is None:
            assert a.accuracy is not None and a.accuracy.passed, a.name
        else:
            assert a.accuracy is None and reports[Path(a.path).name]["not_measured"] == gap, a.name
    # A full-range ORT model is gated on every host: natively, or unfused where the kernels saturate.
    full = arts["onnxruntime-int8-full"]
    assert full.accuracy is not None and full.accuracy.passed
    assert ("gate_ran" in full.notes) == (not here.has("int8-dot"))


def test_the_gate_leaves_what_a_cpu_cannot_compute_to_the_device() -> None:
    """The builder's rule (``gate.host_gap``) on the CPUs a build runs on: fp16 and bf16 IRs are gated
    only where the CPU computes in them, full-range int8 only with int8-dot (ONNX Runtime's unfused)."""
    from edgekit.convert.artifact import Artifact
    from edgekit.convert.gate import host_gap

    fp16 = Artifact(Path("m.xml"), "openvino", "fp16", requires=("fp16",))  # rpi5's
    bf16 = Artifact(Path("m.xml"), "openvino", "bf16")  # without the profile's requires: the rule adds it
    full = {b: Artifact(Path("m"), b, "int8", variant="full") for b in ("onnxruntime", "openvino")}
    assert host_gap(fp16, cpu("sapphire-rapids"), "x86_64") is None
    assert host_gap(bf16, cpu("zen4"), "x86_64") is None
    for name, art in (("zen4", fp16), ("epyc-avx2", bf16), ("epyc-avx2", full["openvino"])):
        gap = host_gap(art, cpu(name), "x86_64")
        assert gap is not None and gap.startswith("this host lacks") and "edgekit bench" in gap, (name, art)
    assert "fp16 (none of avx512_fp16, amx_fp16)" in (host_gap(fp16, cpu("zen4"), "x86_64") or "")
    assert host_gap(full["onnxruntime"], cpu("epyc-avx2"), "x86_64") is None  # gated unfused
    lib = Artifact(Path("m.so"), "tvm", "fp32", arch="aarch64")
    assert host_gap(lib, cpu("zen4"), "x86_64") == "built for aarch64, this host is x86_64"
    assert host_gap(fp16, cpu("cortex-a76"), "aarch64") is None


def test_on_an_avx2_cpus_kernels_full_range_int8_fails_the_gate_and_the_portable_recipe_passes(
    x86_bundle: tuple[Path, dict[str, Any]],
) -> None:
    """Why the x86 bundle carries two int8 recipes, on real kernels rather than flags.

    oneDNN limited to AVX2 (``ONEDNN_MAX_CPU_ISA``, read once a process) runs the u8 x s8
    kernels of a CPU without VNNI, whose int16 pair sums saturate on full 8-bit weights: the
    full-range artifact then disagrees with fp32 (72% of the decisive smoke images, measured),
    while the 7-bit portable one, which such a CPU picks, still passes the build's gate.
    """
    pytest.importorskip("openvino")
    if "avx2" not in read_cpu().flags:
        pytest.skip("this CPU has no AVX2: oneDNN cannot run the AVX2 kernels here")
    bundle, _ = x86_bundle
    cmd = [sys.executable, "-m", "benchmarks.int8_kernels", str(bundle), "--isa", "AVX2", "--queries", "0"]
    r = subprocess.run([*cmd, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["artifact"]: row for row in json.loads(r.stdout)["runs"][0]["artifacts"]}
    full, portable = rows["openvino-int8-full"], rows["openvino-int8"]
    # The limit held: only AVX2 kernels, no VNNI (avx512) or AMX ones, ran the int8 convolutions.
    assert full["kernels"] and all("avx2" in k for k in full["kernels"]), full["kernels"]
    assert portable["passed_gate"] and portable["top1_agreement"] >= 0.98
    assert not full["passed_gate"]
    assert full["max_abs_logit_diff"] > 2 * portable["max_abs_logit_diff"]


def test_a_saturating_build_host_gates_full_range_int8_unfused(
    tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a CPU without int8-dot the build runs the QDQ graph unfused, and leaves OpenVINO's to the device."""
    pytest.importorskip("openvino")
    import edgekit.convert.gate as gate
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    monkeypatch.setattr(gate, "this_cpu", lambda: cpu("epyc-avx2"))
    card = card_for_file(tiny.onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
    result = build(
        BuildRequest(
            card=card,
            device="x86_64-cpu",
            out=tmp_path / "b",
            onnx=tiny.onnx,
            backends=("onnxruntime", "openvino"),
            precisions=("int8",),
            allow_accuracy_drop=True,
            use_cache=False,
            measure_latency=False,
        )
    )
    reports = {r.recipe: r for r in result.reports}
    assert set(reports) == {
        "onnxruntime-int8-full",
        "openvino-int8-full",
        "onnxruntime-int8",
        "openvino-int8",
    }
    ort_full = reports["onnxruntime-int8-full"]
    assert ort_full.accuracy is not None and "unfused" in ort_full.evaluated_as
    ov_full = reports["openvino-int8-full"]
    assert ov_full.accuracy is None and "lacks int8-dot" in ov_full.not_measured
    assert reports["onnxruntime-int8"].accuracy is not None and not reports["onnxruntime-int8"].evaluated_as


def test_a_cached_step_keeps_the_variant(tmp_path: Path) -> None:
    """A second build takes artifacts from the cache: they must come back as the recipe that made them."""
    from edgekit.convert.artifact import Artifact
    from edgekit.convert.build_cache import _from_json, _to_json

    made = Artifact(tmp_path / "m.onnx", "onnxruntime", "int8", variant="full", requires=("int8-dot",))
    back = _from_json(_to_json(made, tmp_path), tmp_path)
    assert (back.variant, back.requires, back.key) == ("full", ("int8-dot",), "onnxruntime-int8-full")
