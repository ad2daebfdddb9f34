"""A new user's first hour, as the README walks it: their own key, their bundle, ``edgekit.load``.

``edgekit keys generate`` writes a key pair to the config folder; a bundle signed with it
runs through ``edgekit.load`` and ``edgekit run`` alike, with no key named (one trust rule
for both); ``trusted_keys`` takes a path as ``str``, ``Path`` or a list; a refusal's hint
names what the caller can pass (``trusted_keys=`` in Python, ``--key`` on the command line);
a bundle path that is not there says so; and ``edgekit build`` checks its signing key before
it converts anything.  Against tiny real bundles and the real command.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_detector import classifier_bundle

import edgekit
from edgekit.errors import EdgekitError

from conftest import edgekit as edgekit_cli


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny classifier bundle and the public key that signed it (not in any trust store)."""
    from edgekit.bundle import generate_keypair

    private, public = generate_keypair(tmp_path / "keys" / "builder")
    return classifier_bundle(tmp_path / "bundle", private), public


def frame() -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("form", ["str", "Path", "list of str", "tuple of Path", "~"])
def test_trusted_keys_takes_a_path_as_str_path_or_a_list(
    signed: tuple[Path, Path], form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, public = signed
    monkeypatch.setenv("HOME", str(public.parent))
    keys = {
        "str": str(public),
        "Path": public,
        "list of str": [str(public)],
        "tuple of Path": (public,),
        "~": f"~/{public.name}",
    }[form]
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=keys) as model:
        assert model.classify(frame())


@pytest.mark.parametrize(
    "keys", [42, b"k.pub.pem", [Path("k.pub.pem"), 7]], ids=["int", "bytes", "list-with-int"]
)
def test_trusted_keys_of_another_type_is_a_clear_error(signed: tuple[Path, Path], keys: object) -> None:
    with pytest.raises(EdgekitError) as err:
        edgekit.load(signed[0], device="x86_64-cpu", trusted_keys=keys)  # type: ignore[arg-type]
    assert "trusted_keys takes a path" in err.value.message and "trusted_keys=" in err.value.hint


@pytest.fixture
def new_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """A user with nothing set up: an empty config folder and no $EDGEKIT_TRUST (the run's store is not theirs)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("EDGEKIT_TRUST", raising=False)
    monkeypatch.setenv("EDGEKIT_AGENT_ROOT", str(tmp_path / "no-agent"))
    return {**os.environ}


def generated_key(env: dict[str, str]) -> tuple[Path, Path]:
    """``edgekit keys generate`` with no ``--out``, as the README runs it; the pair it wrote."""
    r = edgekit_cli(env, "keys", "generate")
    assert r.returncode == 0, r.stderr
    folder = Path(env["XDG_CONFIG_HOME"]) / "edgekit" / "keys"
    return folder / "edgekit.pem", folder / "edgekit.pub.pem"


def test_the_key_keys_generate_made_is_trusted_by_load_and_by_run(
    new_user: dict[str, str], tmp_path: Path
) -> None:
    private, _ = generated_key(new_user)
    bundle = classifier_bundle(tmp_path / "bundle", private)
    with edgekit.load(bundle, device="x86_64-cpu") as model:  # no key named: the user's own is trusted
        assert model.classify(frame(), k=3)
    r = edgekit_cli(new_user, "run", str(bundle), "--source", "synthetic:64x48@30", "--frames", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert "UNSIGNED" not in r.stderr


def test_a_refusal_from_python_names_trusted_keys_and_from_the_cli_names_key(
    signed: tuple[Path, Path], new_user: dict[str, str]
) -> None:
    bundle, _ = signed
    with pytest.raises(EdgekitError) as err:
        edgekit.load(bundle, device="x86_64-cpu")
    hint = err.value.hint
    assert "trusted_keys=" in hint and "allow_unsigned=True" in hint, hint
    assert "--key" not in hint and "--allow-unsigned" not in hint, hint
    r = edgekit_cli(new_user, "run", str(bundle), "--source", "synthetic:64x48@30", "--frames", "1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--key" in r.stderr and "--allow-unsigned" in r.stderr and "trusted_keys" not in r.stderr


def test_a_missing_bundle_says_it_does_not_exist(tmp_path: Path) -> None:
    for missing in (tmp_path / "bundles" / "enl0-x86", tmp_path / "enl0-x86.tar.gz"):
        with pytest.raises(EdgekitError) as err:
            edgekit.load(missing, device="x86_64-cpu")
        assert f"{missing} does not exist" in err.value.message
        assert "is not a file" not in err.value.message


# -- edgekit build checks its signing key first ------------------------------------------------------


def tiny_onnx(folder: Path) -> Path:
    import tiny_model

    folder.mkdir(parents=True, exist_ok=True)
    return tiny_model.write_onnx(folder / "tiny.onnx", tiny_model.make_weights())


@pytest.mark.parametrize("problem", ["missing", "public", "not a key", "folder"])
def test_build_checks_the_signing_key_before_any_step(
    problem: str, new_user: dict[str, str], tmp_path: Path
) -> None:
    from edgekit.bundle import generate_keypair
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    onnx = tiny_onnx(tmp_path / "model")
    _, public = generate_keypair(tmp_path / "keys" / "k")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    key = {"missing": tmp_path / "edgekit.pem", "public": public, "not a key": junk, "folder": tmp_path}[
        problem
    ]
    steps: list[tuple[str, str]] = []
    req = BuildRequest(
        card=card_for_file(onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0)),
        device="x86_64-cpu",
        out=tmp_path / "out",
        onnx=onnx,
        backends=("onnxruntime",),
        precisions=("fp32",),
        measure_latency=False,
        sign_key=key,
    )
    with pytest.raises(EdgekitError) as err:
        build(req, lambda step, status: steps.append((step, status)))
    assert str(key) in err.value.message and err.value.hint
    assert steps == []  # refused before the first step, not after the last
    assert not (tmp_path / "out").exists()


def test_a_missing_sign_key_hint_names_the_key_keys_generate_wrote(
    new_user: dict[str, str], tmp_path: Path
) -> None:
    private, _ = generated_key(new_user)
    onnx = tiny_onnx(tmp_path / "model")
    r = edgekit_cli(new_user, "build", "--onnx", str(onnx), "--mean", "0,0,0", "--std", "255,255,255",
            "--device", "x86_64-cpu", "-o", str(tmp_path / "b"), "--sign-key", "edgekit.pem")  # fmt: skip
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "edgekit.pem does not exist" in r.stderr and str(private) in r.stderr, r.stderr
    assert "fp32-onnx" not in r.stderr and not (tmp_path / "b").exists()


def test_the_generated_key_signs_a_build(new_user: dict[str, str], tmp_path: Path) -> None:
    private, _ = generated_key(new_user)
    onnx = tiny_onnx(tmp_path / "model")
    out = tmp_path / "b"
    r = edgekit_cli(new_user, "build", "--onnx", str(onnx), "--mean", "0,0,0", "--std", "255,255,255",
            "--device", "x86_64-cpu", "--backends", "onnxruntime", "--precisions", "fp32",
            "-o", str(out), "--sign-key", str(private), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    with edgekit.load(out, device="x86_64-cpu") as model:
        assert model.classify(frame())
    shutil.rmtree(out)
