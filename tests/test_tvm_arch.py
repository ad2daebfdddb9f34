"""A TVM library cross-compiled for aarch64 is refused on x86_64 with a clear message, not a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgekit._core.elf import elf_arch, host_arch
from edgekit.backends import open_session
from edgekit.errors import ModelLoadError

from conftest import TinyArtifacts

pytest.importorskip("tvm", reason="apache-tvm is not installed (pip install -e '.[tvm]')")


@pytest.fixture(scope="module")
def aarch64_lib(tiny: TinyArtifacts, aarch64_cc: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgekit.convert.tvm import compile_onnx
    from edgekit.runtime.profiles import get_profile

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
