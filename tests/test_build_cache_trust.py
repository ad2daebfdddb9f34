"""The build cache is checked before anything in it is used (edgekit/convert/cache_trust.py).

Through the real ``edgekit build`` on the tiny model: a cached ONNX with one flipped byte, a
cached TVM library swapped for one with a constructor, a truncated ``entry.json``, and an
entry sealed under another user's key are each discarded with a warning and built again;
what is signed into the bundle is what a clean build makes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgekit.core.io import sha256_file
from edgekit.errors import BuildError

import tiny_model
from conftest import edgekit

NOT_USED = "is not used"
ORT_FP32 = Path("artifacts", "onnxruntime-fp32", "tiny-fp32.onnx")  # in a bundle


@pytest.fixture
def model(tmp_path: Path) -> Path:
    onnx = tiny_model.write_onnx(tmp_path / "tiny.onnx", tiny_model.make_weights())
    (tmp_path / "labels.txt").write_text("\n".join(f"class {i}" for i in range(tiny_model.NUM_CLASSES)))
    return onnx


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A cache and a cache key of this test's own (the key outside the cache, as it must be)."""
    return {
        **os.environ,
        "EDGEKIT_CACHE": str(tmp_path / "cache"),
        "EDGEKIT_CACHE_KEY_FILE": str(tmp_path / "config" / "cache.key"),
    }


def build(
    env: dict[str, str], model: Path, out: Path, backends: str, key: Path | None = None, check: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    sign = ["--sign-key", str(key)] if key else []
    # The tiny model has no tuned TVM schedules: a TVM library of it is built only when asked.
    untuned = ["--tvm-untuned"] if "tvm" in backends else []
    r = edgekit(
        env,
        "build",
        "--onnx",
        str(model),
        "--device",
        "x86_64-cpu",
        "--backends",
        backends,
        "--precisions",
        "fp32",
        "--mean",
        "127",
        "--std",
        "128",
        "--labels",
        str(model.parent / "labels.txt"),
        "-o",
        str(out),
        *sign,
        *untuned,
        "--json",
    )
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Traceback" not in r.stderr
    return r, json.loads(r.stdout) if r.returncode == 0 else {}


def entry_of(env: dict[str, str], step: str) -> Path:
    """The cache entry folder of ``step``."""
    for doc in Path(env["EDGEKIT_CACHE"], "steps").glob("*/entry.json"):
        if json.loads(doc.read_text())["step"] == step:
            return doc.parent
    raise AssertionError(f"no cache entry for {step}")


def test_a_flipped_byte_in_a_cached_onnx_is_rebuilt_and_never_signed(
    model: Path, env: dict[str, str], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    build(env, model, tmp_path / "first", "onnxruntime", keys[0])
    good = sha256_file(tmp_path / "first" / ORT_FP32)
    cached = entry_of(env, "fp32-onnx") / "tiny-fp32.onnx"
    data = bytearray(cached.read_bytes())
    # A byte in the middle of the classifier's weights: the model still loads, and computes wrong.
    at = bytes(data).index(tiny_model.make_weights().w3.tobytes()) + 17
    data[at] ^= 0x01
    cached.write_bytes(bytes(data))

    r, report = build(env, model, tmp_path / "second", "onnxruntime", keys[0])
    bundled = tmp_path / "second" / ORT_FP32
    assert sha256_file(bundled) == good, "the flipped ONNX was signed into the bundle"
    assert NOT_USED in r.stderr and "does not match the hash" in r.stderr, r.stderr[-2000:]
    assert "fp32-onnx" not in report["cache_hits"]
    v = edgekit(env, "verify", str(tmp_path / "second"), "--key", str(keys[1]), "--require-signature")
    assert v.returncode == 0, v.stdout + v.stderr
    # The entry was written again, whole: the next build takes it.
    assert entry_of(env, "fp32-onnx").joinpath("tiny-fp32.onnx").read_bytes() != bytes(data)
    _, again = build(env, model, tmp_path / "third", "onnxruntime")
    assert "fp32-onnx" in again["cache_hits"]


def test_a_swapped_tvm_library_is_never_loaded(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("tvm", reason="TVM is not installed (edgekit[tvm])")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to make the hostile library with")
    build(env, model, tmp_path / "first", "tvm")
    entry = entry_of(env, "tvm-fp32")
    library = next(entry.glob("*.so"))
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "evil.c"
    src.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void evil(void) {\n"
        f'  FILE *f = fopen("{marker}", "w"); if (f) {{ fputs("ran", f); fclose(f); }}\n'
        "}\n"
    )
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(library), str(src)], check=True)
    evil = library.read_bytes()

    r, report = build(env, model, tmp_path / "second", "tvm", check=False)
    assert not marker.exists(), "the cached library's constructor ran inside edgekit build"
    assert r.returncode == 0, r.stderr[-3000:]
    assert NOT_USED in r.stderr and library.name in r.stderr, r.stderr[-2000:]
    assert "tvm-fp32" not in report["cache_hits"]
    assert (tmp_path / "second" / "artifacts" / "tvm-fp32" / library.name).read_bytes() != evil
    assert next(entry_of(env, "tvm-fp32").glob("*.so")).read_bytes() != evil
    (tvm,) = [a for a in report["artifacts"] if a["backend"] == "tvm"]
    assert tvm["accuracy"]["passed"]


def test_a_truncated_entry_is_a_warning_and_a_rebuild(
    model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    build(env, model, tmp_path / "first", "onnxruntime")
    doc = entry_of(env, "fp32-onnx") / "entry.json"
    doc.write_bytes(doc.read_bytes()[:40])

    r, report = build(env, model, tmp_path / "second", "onnxruntime", check=False)
    assert "Traceback" not in r.stderr and r.returncode == 0, r.stderr[-3000:]
    assert NOT_USED in r.stderr and "not whole JSON" in r.stderr, r.stderr[-2000:]
    assert "fp32-onnx" not in report["cache_hits"]
    # A missing file is the same: warned about and built again.
    (entry_of(env, "fp32-onnx") / "tiny-fp32.onnx").unlink()
    r, report = build(env, model, tmp_path / "third", "onnxruntime")
    assert NOT_USED in r.stderr and "is missing" in r.stderr, r.stderr[-2000:]
    assert "fp32-onnx" not in report["cache_hits"]


def test_an_entry_sealed_under_another_key_is_rebuilt(
    model: Path, env: dict[str, str], tmp_path: Path
) -> None:
    """Whoever else writes the shared cache — and so can rewrite a file and its recorded hash — has another key."""
    other = {**env, "EDGEKIT_CACHE_KEY_FILE": str(tmp_path / "other-user" / "cache.key")}
    build(other, model, tmp_path / "theirs", "onnxruntime")
    cached = entry_of(env, "fp32-onnx")
    # They flip a byte and record the flipped file's hash and size: a plain hash would pass.
    onnx = cached / "tiny-fp32.onnx"
    data = bytearray(onnx.read_bytes())
    data[bytes(data).index(tiny_model.make_weights().w3.tobytes()) + 3] ^= 0x40
    onnx.write_bytes(bytes(data))
    doc = json.loads((cached / "entry.json").read_text())
    doc["files"]["tiny-fp32.onnx"] = {"sha256": sha256_file(onnx), "size": len(data)}
    (cached / "entry.json").write_text(json.dumps(doc))

    r, report = build(env, model, tmp_path / "mine", "onnxruntime")
    assert bytes(data) not in (tmp_path / "mine" / ORT_FP32).read_bytes(), "their entry was used"
    assert NOT_USED in r.stderr and "not sealed with this user's cache key" in r.stderr, r.stderr[-2000:]
    assert "fp32-onnx" not in report["cache_hits"]
    # The key was made on first use, outside the cache, readable by its owner only.
    key = Path(env["EDGEKIT_CACHE_KEY_FILE"])
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not key.is_relative_to(env["EDGEKIT_CACHE"])


def test_a_key_others_can_read_is_not_used(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    build(env, model, tmp_path / "first", "onnxruntime")
    Path(env["EDGEKIT_CACHE_KEY_FILE"]).chmod(0o644)
    r, report = build(env, model, tmp_path / "second", "onnxruntime")
    assert "build cache not used" in r.stderr and "chmod 600" in r.stderr, r.stderr[-2000:]
    assert report["cache_hits"] == []


def test_the_demo_signs_with_a_key_kept_outside_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo loads its cached bundle only when its own key signed it: that key must not be in the cache too."""
    from edgekit.demo import demo_dir, demo_key

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    private, public = demo_key()
    assert private.is_file() and public.is_file()
    assert not private.is_relative_to(tmp_path / "cache") and not private.is_relative_to(demo_dir())
    assert private.is_relative_to(tmp_path / "config")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_a_cached_tuning_database_is_used_only_as_sealed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Schedules decide the code compiled into the library a build loads and signs: the same rule as steps."""
    from edgekit.convert import tvm_database as tdb
    from edgekit.device.profiles import get_profile

    target, sha = dict(get_profile("x86_64-cpu").tvm_target), "cd" * 32
    monkeypatch.setenv("EDGEKIT_CACHE_KEY_FILE", str(tmp_path / "mine.key"))
    cached = tdb.cache_location(sha, target, tmp_path / "cache")
    cached.mkdir(parents=True)
    for name in tdb.TABLES:
        (cached / name).write_text('{"schedule": 1}\n')
    (cached / tdb.META_FILE).write_text(json.dumps({"target_key": tdb.target_key(target), "trials": 8}))

    def found() -> tdb.TuningDatabase | None:
        return tdb.find_database(sha, target, cache_dir=tmp_path / "cache")

    with caplog.at_level("WARNING"):
        assert found() is None  # written by someone, sealed by no one
    assert "not sealed" in caplog.text
    monkeypatch.setenv("EDGEKIT_CACHE_KEY_FILE", str(tmp_path / "theirs.key"))
    tdb.seal_database(cached)
    monkeypatch.setenv("EDGEKIT_CACHE_KEY_FILE", str(tmp_path / "mine.key"))
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert found() is None
    assert "not sealed with this user's cache key" in caplog.text

    tdb.seal_database(cached)
    db = found()
    assert db is not None and db.source == "cache" and db.trials == 8
    assert tdb.fingerprint(db)
    (cached / tdb.RECORD_FILE).write_text('{"schedule": 2}\n')  # same size, other schedules
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert found() is None
    assert "does not match the hash" in caplog.text
    # Swapped after its check: refused when read, never applied.
    with pytest.raises(BuildError, match="changed in the cache after its seal was checked"):
        tdb.fingerprint(db)
