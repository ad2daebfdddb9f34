"""edgekit's per-layer kernels for OpenVINO's CPU plugin: which layers, on which CPUs, and nothing else changes."""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.backends import openvino_kernels as ok
from edgekit.core import cpu as cpu_module
from edgekit.core.cpu import CpuFeatures

AMX = frozenset({"avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"})
VNNI = frozenset({"avx2", "avx512f", "avx512_vnni"})  # Ice Lake, Zen 4: no AMX
AVX2 = frozenset({"avx2", "fma"})


def _artifacts(bundle: Path) -> dict[str, Path]:
    from edgekit.bundle import read_manifest

    return {a.name: bundle / a.path for a in read_manifest(bundle).artifacts}


def _choices(xml: Path, flags: frozenset[str]) -> list[ok.Choice]:
    return ok.choose(ET.parse(xml).getroot(), flags)


def test_the_rules_pick_the_int8_stem_and_depthwise_layers_on_an_amx_cpu_only(
    x86_bundle: tuple[Path, dict[str, Any]],
) -> None:
    path = _artifacts(x86_bundle[0])
    full = _choices(path["openvino-int8-full"], AMX)
    by_rule: dict[str, list[str]] = {}
    for c in full:
        by_rule.setdefault(c.rule, []).append(c.layer)
    # EfficientNet-Lite0: one stem over the 3 colour channels, 16 depthwise convolutions.
    assert by_rule["int8-stem-without-amx"] == ["/_conv_stem/Conv/WithoutBiases"]
    assert len(by_rule["int8-depthwise-jit"]) == 16
    assert all("depthwise" in name for name in by_rule["int8-depthwise-jit"])
    assert {c.kernel for c in full} == {"cpu:jit_avx512", "cpu:jit_avx512_dw"}
    # No AMX, nothing to undo: a VNNI CPU's plugin already runs the stem on the VNNI kernel.
    assert _choices(path["openvino-int8-full"], VNNI) == []
    assert _choices(path["openvino-int8-full"], AVX2) == []
    # Only int8 layers: nothing in the fp32 IR, and not the portable IR's float first layers.
    assert _choices(path["openvino-fp32"], AMX) == []
    portable = _choices(path["openvino-int8"], AMX)
    assert portable and all(c.rule == "int8-depthwise-jit" for c in portable)
    assert "/_blocks.0/_depthwise_conv/Conv/WithoutBiases" not in {c.layer for c in portable}


def test_a_rule_applies_by_cpu_flags_op_channels_and_depthwise() -> None:
    stem = ok.Layer("stem", "Convolution", 3, depthwise=False)
    pointwise = ok.Layer("pw", "Convolution", 32, depthwise=False)
    dw = ok.Layer("dw", "GroupConvolution", 32, depthwise=True)
    grouped = ok.Layer("g", "GroupConvolution", 32, depthwise=False)
    stem_rule, dw_rule = ok.rules()
    assert stem_rule.applies(stem, AMX)
    assert not stem_rule.applies(stem, VNNI)
    assert not stem_rule.applies(pointwise, AMX)
    assert not stem_rule.applies(dw, AMX)
    assert dw_rule.applies(dw, AMX)
    assert not dw_rule.applies(grouped, AMX)
    assert not dw_rule.applies(stem, AMX)


def test_the_session_runs_the_preferred_kernels_with_identical_outputs_and_the_file_untouched(
    x86_bundle: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On any x86 CPU: the session is told it has AMX; the plugin runs what this CPU has."""
    pytest.importorskip("openvino")
    import openvino as ov

    from edgekit.backends import open_session
    from edgekit.backends.openvino import read_ir
    from edgekit.bundle import read_manifest
    from edgekit.convert.images import smoke_set
    from edgekit.processing.preprocessing import PreprocessSpec

    real = cpu_module.this_cpu()
    if real.arch != "x86_64":
        pytest.skip("the rules are for x86 CPUs; this is " + real.arch)
    monkeypatch.setattr(cpu_module, "this_cpu", lambda: CpuFeatures("x86_64", AMX))
    bundle = x86_bundle[0]
    xml = _artifacts(bundle)["openvino-int8-full"]
    before = hashlib.sha256(xml.read_bytes()).hexdigest()
    batch = smoke_set().batch(PreprocessSpec.from_manifest(read_manifest(bundle)))[:8]
    with (
        open_session(xml, "openvino") as ours,
        open_session(xml, "openvino", kernels="plugin") as theirs,
    ):
        assert len(ours.kernels) == 17 and theirs.kernels == ()
        assert ours.kernels[0] == "/_conv_stem/Conv/WithoutBiases: cpu:jit_avx512 (int8-stem-without-amx)"
        for x in batch:
            assert np.array_equal(ours.run(x[None])[0], theirs.run(x[None])[0])
        twin = ours.batched(2)  # compiled later, from the model read with the preferences
        assert twin.kernels == ours.kernels
        pair = np.stack([batch[0], batch[1]])
        assert np.array_equal(twin.run(pair)[0], theirs.batched(2).run(pair)[0])
    assert hashlib.sha256(xml.read_bytes()).hexdigest() == before

    # What ran: the preferred kernel where this CPU has it; the plugin's own where it has not.
    core = ov.Core()
    model, _ = read_ir(core, xml, "CPU", "edgekit")
    model.reshape({model.inputs[0]: [1, *list(model.inputs[0].get_partial_shape())[1:]]})
    request = core.compile_model(model, "CPU", {"PERF_COUNT": True}).create_infer_request()
    request.infer({0: batch[:1]})
    ran = {p.node_name: p.exec_type for p in request.get_profiling_info()}
    stem = ran["/_conv_stem/Conv/WithoutBiases"]
    if {"avx512f", "avx512_vnni"} <= real.flags:
        assert stem.startswith("jit_avx512"), stem
    else:
        assert not stem.startswith("jit_avx512"), stem  # passed over: the CPU cannot run it


def test_on_a_cpu_without_amx_nothing_is_chosen(
    x86_bundle: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("openvino")
    from edgekit.backends import open_session

    monkeypatch.setattr(cpu_module, "this_cpu", lambda: CpuFeatures("x86_64", VNNI))
    with open_session(_artifacts(x86_bundle[0])["openvino-int8-full"], "openvino") as s:
        assert s.kernels == ()


def test_an_unknown_kernels_option_is_a_load_error_naming_the_choices(tiny: Any) -> None:
    pytest.importorskip("openvino")
    from edgekit.backends import open_session
    from edgekit.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as e:
        open_session(tiny.openvino_ir, "openvino", kernels="fastest")
    assert "edgekit, plugin" in e.value.message


def test_an_ir_that_does_not_parse_is_left_to_openvinos_reader(tmp_path: Path) -> None:
    bad = tmp_path / "m.xml"
    bad.write_text("<net><layers><layer id='0'", encoding="utf-8")
    assert ok.prefer(bad, AMX) is None
    assert ok.prefer(tmp_path / "missing.xml", AMX) is None
