"""``import edgekit`` must stay cheap on a device: no runtime, no numpy, until one is used."""

from __future__ import annotations

import json
import subprocess
import sys

RUNTIMES = [
    "onnxruntime",
    "openvino",
    "ai_edge_litert",
    "tflite_runtime",
    "tvm",
    "tensorrt",
    "numpy",
    "cv2",
    "torch",
    "paho",
]


def loaded_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_import_edgekit_pulls_in_no_runtime() -> None:
    assert loaded_after("import edgekit").isdisjoint(RUNTIMES)


def test_profiles_registry_and_selection_pull_in_no_runtime() -> None:
    code = (
        "import edgekit.selection.plan, edgekit.cli\n"
        "from edgekit.device.profiles import all_profiles\n"
        "from edgekit.backends import registry\n"
        "all_profiles(); [registry.get(n) for n in registry.names()]"
    )
    assert loaded_after(code).isdisjoint(RUNTIMES)


def test_probing_one_backend_imports_only_its_runtime() -> None:
    loaded = loaded_after("from edgekit.backends import registry; registry.get('onnxruntime').available()")
    assert "onnxruntime" in loaded
    assert loaded.isdisjoint(set(RUNTIMES) - {"onnxruntime", "numpy"})


def test_matching_this_host_to_a_profile_probes_no_runtime_it_cannot_need() -> None:
    # OpenVINO is asked for its devices only when a profile that fits needs one (an NPU needs
    # /dev/accel/accel*): importing it and starting its Core was 0.45 s of a 1.2 s cold start.
    from pathlib import Path

    import pytest

    if any(Path("/dev").glob("accel/accel*")) or any(Path("/dev").glob("dri/renderD*")):
        pytest.skip("this host has an accelerator device node: probing OpenVINO is right here")
    loaded = loaded_after("from edgekit.device.host import match_profile; match_profile()")
    assert loaded.isdisjoint(RUNTIMES)


def test_every_name_edgekit_bench_lists_loads() -> None:
    # Its names load on first use, from a table of module names that nothing else checks.
    import edgekit.bench

    for name in edgekit.bench.__all__:
        assert getattr(edgekit.bench, name) is not None, name
