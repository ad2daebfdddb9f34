"""Device profiles: the shipped ones load, aliases resolve, and every mistake names the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.device.profiles import all_profiles, get_profile, profile_dirs, read_profile
from edgekit.errors import ProfileError

REQUIRED = {
    "jetson-orin-nano",
    "jetson-orin-agx",
    "jetson-nano",
    "rpi5",
    "rpi4",
    "coral-devboard",
    "rpi4-coral-usb",
    "intel-npu",
    "arm64-cpu",
    "x86_64-cpu",
}

GOOD = """\
name = "{name}"
description = "A test board"
aliases = ["tb"]
arch = "aarch64"
cpu = "cortex-a55"
budget_ms = 50
camera = "0"
runtime_packages = ["onnxruntime"]

[tvm_target]
kind = "llvm"
mtriple = "aarch64-linux-gnu"

[[candidates]]
backend = "onnxruntime"
options = {{ intra_op_threads = 4 }}
"""


def write(tmp_path: Path, text: str, name: str = "testboard") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_every_required_profile_ships() -> None:
    assert set(all_profiles()) >= REQUIRED


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_profile_has_what_a_device_needs(name: str) -> None:
    p = get_profile(name)
    assert p.arch in ("x86_64", "aarch64")
    assert p.tvm_target["kind"] == "llvm"
    triple = p.tvm_target.get("mtriple", "")
    assert triple.startswith(p.arch), f"{name}: TVM triple {triple} does not match arch {p.arch}"
    assert 0 < p.budget_ms <= 100 and p.camera and p.runtime_packages and p.cpu
    assert p.candidates and len({c.key for c in p.candidates}) == len(p.candidates)
    # The safest candidate comes last: every device ends on a plain CPU runtime.
    assert p.candidates[-1].backend in ("onnxruntime", "openvino", "tvm", "litert")


@pytest.mark.parametrize(
    ("alias", "name"), [("jetson", "jetson-orin-nano"), ("pi", "rpi5"), ("coral", "coral-devboard")]
)
def test_aliases_resolve(alias: str, name: str) -> None:
    assert get_profile(alias).name == name


@pytest.mark.parametrize(
    ("name", "decoder"),
    [
        ("jetson-nano", "nvv4l2"),
        ("jetson-orin-nano", "nvv4l2"),
        ("rpi5", "v4l2"),
        ("rpi4", "v4l2"),
        ("intel-npu", "vaapi"),
        ("x86_64-cpu", "software"),
        ("arm64-cpu", "software"),
    ],
)
def test_each_device_decodes_video_on_its_own_hardware(name: str, decoder: str) -> None:
    assert get_profile(name).decoder == decoder


def test_a_profile_without_a_decoder_decodes_in_software(tmp_path: Path) -> None:
    assert read_profile(write(tmp_path, GOOD.format(name="testboard"))).decoder == "software"


def test_jetson_prefers_tensorrt_then_ort_gpu_then_tvm_then_cpu() -> None:
    backends = [(c.backend, c.precision) for c in get_profile("jetson").candidates]
    assert backends[0] == ("tensorrt", "fp16")
    assert backends[1][0] == "onnxruntime"
    providers = [
        p if isinstance(p, str) else p[0] for p in get_profile("jetson").candidates[1].options["providers"]
    ]
    assert providers[:2] == ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    assert [b for b, _ in backends[2:]] == ["tvm", "onnxruntime"]


def test_unknown_device_suggests_the_closest() -> None:
    with pytest.raises(ProfileError) as err:
        get_profile("jetsn")
    assert "unknown device 'jetsn'" in err.value.message and "did you mean 'jetson'" in err.value.message
    assert "edgekit devices list" in err.value.hint


def test_a_good_file_reads(tmp_path: Path) -> None:
    p = read_profile(write(tmp_path, GOOD.format(name="testboard")))
    assert p.name == "testboard" and p.budget_ms == 50.0 and p.candidates[0].key == "onnxruntime-fp32"
    assert p.candidates[0].options["intra_op_threads"] == 4


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        (lambda t: t.replace('cpu = "cortex-a55"\n', ""), "cpu", "is missing"),
        (lambda t: t.replace("budget_ms = 50", 'budget_ms = "fast"'), "budget_ms", "must be int or float"),
        (lambda t: t.replace("budget_ms = 50", "budget_ms = true"), "budget_ms", "must be int or float"),
        (lambda t: t.replace("budget_ms = 50", "budget_ms = -3"), "budget_ms", "between 0 and 10000"),
        (lambda t: t.replace('arch = "aarch64"', 'arch = "sparc"'), "arch", "must be one of"),
        (
            lambda t: t.replace('backend = "onnxruntime"', 'backend = "onnxruntme"'),
            "candidates[0].backend",
            "did you mean 'onnxruntime'",
        ),
        (
            lambda t: t.replace("intra_op_threads", "intra_threads"),
            "candidates[0].options.intra_threads",
            "not an option of onnxruntime",
        ),
        (lambda t: t + 'precision = "int4"\n', "candidates[0].precision", "must be one of"),
        (lambda t: t.replace('camera = "0"', 'camera = "0"\ncamrea = "1"'), "camrea", "not a known field"),
        (lambda t: t.replace('kind = "llvm"\n', ""), "tvm_target.kind", "is missing"),
        (lambda t: t.replace('aliases = ["tb"]', 'aliases = ["tb", 3]'), "aliases[1]", "must be a string"),
        (lambda t: t + '\n[match]\nedgetpu = "wifi"\n', "match.edgetpu", "must be one of"),
        (lambda t: t.replace('camera = "0"', 'camera = "0"\ndecoder = "nvdec"'), "decoder", "must be one of"),
        (
            lambda t: t.replace('name = "testboard"', 'name = "otherboard"'),
            "name",
            "name the file otherboard.toml",
        ),
        (lambda t: t + '\n[[candidates]]\nbackend = "onnxruntime"\n', "candidates[1].name", "appears twice"),
    ],
)
def test_mistakes_name_file_and_field(tmp_path: Path, change, field: str, problem: str) -> None:  # type: ignore[no-untyped-def]
    from edgekit.backends import registry

    path = write(tmp_path, change(GOOD.format(name="testboard")))
    backends = {n: registry.get(n).options for n in registry.names()}
    with pytest.raises(ProfileError) as err:
        read_profile(path, backends)
    assert str(path) in err.value.message
    assert f"field '{field}'" in err.value.message
    assert problem in err.value.message


def test_invalid_toml_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "testboard"\narch = \n')
    with pytest.raises(ProfileError, match=r"testboard.toml: not valid TOML: .*line 2"):
        read_profile(path)


def test_user_profiles_add_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, GOOD.format(name="testboard"))
    write(
        tmp_path,
        GOOD.format(name="rpi5")
        .replace('aliases = ["tb"]', "aliases = []")
        .replace("budget_ms = 50", "budget_ms = 20"),
        "rpi5",
    )
    monkeypatch.setenv("EDGEKIT_DEVICES_PATH", str(tmp_path))
    assert profile_dirs()[0] == tmp_path
    assert get_profile("tb").name == "testboard"
    assert get_profile("rpi5").budget_ms == 20.0  # the user's file wins over the shipped one
    with pytest.raises(ProfileError):  # an override replaces the whole profile, aliases included
        get_profile("pi")


def test_alias_clash_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, GOOD.format(name="testboard").replace('aliases = ["tb"]', 'aliases = ["jetson"]'))
    monkeypatch.setenv("EDGEKIT_DEVICES_PATH", str(tmp_path))
    with pytest.raises(ProfileError, match="'jetson' already names"):
        all_profiles()
