"""A TVM library cross-compiled for aarch64 is refused on x86_64 with a clear message, not a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit.backends import open_session
from edgekit.core.elf import elf_arch, host_arch
from edgekit.errors import ModelLoadError

from conftest import TinyArtifacts

pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install -e '.[tvm]')")


@pytest.fixture(scope="module")
def aarch64_lib(tiny: TinyArtifacts, aarch64_cc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgekit.convert.tvm import compile_onnx
    from edgekit.device.profiles import get_profile

    out = tmp_path_factory.mktemp("a64") / "tiny-rpi5.so"
    return compile_onnx(tiny.onnx, out, get_profile("rpi5").tvm_target).path


def test_cross_compiled_library_is_aarch64(aarch64_lib: Path) -> None:
    assert elf_arch(aarch64_lib) == "aarch64"
    assert aarch64_lib.with_name("tiny-rpi5.io.json").is_file()


@pytest.mark.skipif(host_arch() == "aarch64", reason="this host is aarch64: the library loads here")
def test_loading_it_here_says_which_arch(aarch64_lib: Path) -> None:
    with pytest.raises(ModelLoadError) as err:
        open_session(aarch64_lib)
    assert f"was built for aarch64, this host is {host_arch()}" in err.value.message
    assert "aarch64 device" in err.value.hint


def test_host_library_is_host_arch(tiny: TinyArtifacts) -> None:
    assert tiny.tvm_x86_64 is not None and elf_arch(tiny.tvm_x86_64) == host_arch()


def test_non_elf_file_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.so"
    fake.write_bytes(b"not a library at all")
    assert elf_arch(fake) is None
    with pytest.raises(ModelLoadError, match="not a shared library"):
        open_session(fake)


def test_missing_io_description_is_explained(tiny: TinyArtifacts, tmp_path: Path) -> None:
    assert tiny.tvm_x86_64 is not None
    lonely = tmp_path / "lonely.so"
    lonely.write_bytes(tiny.tvm_x86_64.read_bytes())
    with pytest.raises(ModelLoadError, match=r"no input/output description lonely\.io\.json"):
        open_session(lonely)


def _with_target(tiny: TinyArtifacts, tmp_path: Path, target: dict[str, object] | None) -> Path:
    """A copy of the host's tiny library, its ``.io.json`` recording ``target`` (None: none, as before).

    A new file each time: a library stays mapped after its session closes, and rewriting a
    mapped library in place crashes the process.
    """
    import json

    assert tiny.tvm_x86_64 is not None
    n = len(list(tmp_path.glob("tiny-*.so")))
    lib = tmp_path / f"tiny-{n}.so"
    lib.write_bytes(tiny.tvm_x86_64.read_bytes())
    io = json.loads(tiny.tvm_x86_64.with_name(tiny.tvm_x86_64.stem + ".io.json").read_text())
    assert io["target"]["mcpu"], "compile_onnx records the target it compiled for"
    io.pop("target")
    if target is not None:
        io["target"] = target
    (tmp_path / f"tiny-{n}.io.json").write_text(json.dumps(io))
    return lib


@pytest.mark.skipif(host_arch() != "x86_64", reason="the library here is compiled for x86_64")
def test_a_library_compiled_for_instructions_this_cpu_lacks_is_refused_before_it_runs(
    tiny: TinyArtifacts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its first run would die of SIGILL (a Pi 5's dotprod library on a Pi 4): refused with the flags instead."""
    from edgekit.core import cpu

    avx2_only = cpu.parse_cpuinfo("flags\t: sse4_2 avx fma avx2\n", "x86_64")
    monkeypatch.setattr(cpu, "this_cpu", lambda: avx2_only)
    lib = _with_target(tiny, tmp_path, {"kind": "llvm", "mcpu": "sapphirerapids", "mattr": ["+avx512vnni"]})
    with pytest.raises(ModelLoadError) as err:
        open_session(lib)
    assert "compiled for sapphirerapids +avx512vnni" in err.value.message
    assert "avx512_vnni" in err.value.message and "amx_int8" in err.value.message
    assert "which this CPU lacks" in err.value.message and "edgekit build --device" in err.value.hint
    # What the CPU has runs: an AVX2 target, an older library without a target, an unreadable CPU.
    for target in ({"kind": "llvm", "mcpu": "haswell"}, None):
        with open_session(_with_target(tiny, tmp_path, target)) as session:
            assert session.run(tiny.input_nchw)[0].shape == tiny.expected.shape
    monkeypatch.setattr(cpu, "this_cpu", lambda: cpu.CpuFeatures("x86_64", frozenset()))
    with open_session(_with_target(tiny, tmp_path, {"kind": "llvm", "mcpu": "sapphirerapids"})):
        pass
