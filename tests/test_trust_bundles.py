"""Trust nothing on the wire: a bundle runs only when a trusted key signed it, and a device never goes back.

Against real bundles (a tiny ONNX model built by the real build, the reference x86 bundle for the
agent) and the real CLI: a signature stripped from a bundle is refused under ``--key``; an unsigned
bundle is refused by default with a hint and runs only with ``--allow-unsigned`` (loudly); a signed
bundle whose key nobody here trusts is refused; the manifest used is the one whose signature was
checked; and the agent refuses a bundle older than its floor unless the operator forces it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.errors import EdgekitError

from conftest import EDGEKIT, ROOT

LABELS = tuple(f"thing {i}" for i in range(10))


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Path, Path]) -> Path:
    """A tiny ONNX Runtime bundle, built by the real build and signed with the session's key A."""
    from edgekit.convert.build_records import BuildRequest
    from edgekit.convert.builder import build
    from edgekit.convert.modelcard import card_for_file

    import tiny_model

    out = tmp_path_factory.mktemp("trust")
    onnx = tiny_model.write_onnx(out / "tiny.onnx", tiny_model.make_weights())
    labels = out / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    card = card_for_file(onnx, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0), labels=labels)
    req = BuildRequest(
        card=card,
        device="x86_64-cpu",
        out=out / "bundle",
        onnx=onnx,
        backends=("onnxruntime",),
        precisions=("fp32",),
        use_cache=False,
        measure_latency=False,
        sign_key=keys[0],
    )
    return build(req).bundle


@pytest.fixture(scope="module")
def key_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another key's public half: the one a device trusts, which did not sign ``signed``."""
    return generate_keypair(tmp_path_factory.mktemp("key-b") / "b")[1]


@pytest.fixture
def empty_trust(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """A trust store with nothing in it (in this process and in the CLI's environment)."""
    store = tmp_path / "no-trusted-keys"
    store.mkdir()
    monkeypatch.setenv("EDGEKIT_TRUST", str(store))
    monkeypatch.setenv("EDGEKIT_AGENT_ROOT", str(tmp_path / "no-agent"))
    return {**os.environ}


def stripped(bundle: Path, out: Path, *, keep_signer: bool = False) -> Path:
    """``bundle`` with its signature removed: ``manifest.sig`` deleted and (unless ``keep_signer``) the signer too."""
    shutil.copytree(bundle, out)
    (out / "manifest.sig").unlink()
    if not keep_signer:
        doc = json.loads((out / "manifest.json").read_bytes())
        doc["signature"] = None
        (out / "manifest.json").write_text(json.dumps(doc, indent=2) + "\n")
    return out


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGEKIT, *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)  # type: ignore[list-item]


def run_bundle(env: dict[str, str], bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run(env, "run", str(bundle), "--source", "synthetic:64x48@30", "--frames", "3", "--device",
               "x86_64-cpu", "--json", *args)  # fmt: skip


@pytest.fixture
def no_backend_load(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every backend asked to load an artifact: a refused bundle must reach none."""
    from edgekit.backends import registry

    asked: list[str] = []
    real = registry.get

    def spy(name: str) -> Any:
        asked.append(name)
        return real(name)

    monkeypatch.setattr(registry, "get", spy)
    return asked


# -- load() ----------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_signer", [False, True], ids=["signer-removed", "sig-file-deleted"])
def test_load_refuses_a_stripped_signature_under_a_trusted_key(
    signed: Path, key_b: Path, tmp_path: Path, no_backend_load: list[str], keep_signer: bool
) -> None:
    bundle = stripped(signed, tmp_path / "stripped", keep_signer=keep_signer)
    with pytest.raises(EdgekitError) as err:
        edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[key_b])
    assert "sign" in err.value.message and err.value.hint
    # An explicit --allow-unsigned does not override --key: the key given means "signed by it".
    with pytest.raises(EdgekitError):
        edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[key_b], allow_unsigned=True)
    assert no_backend_load == []  # refused before any native code was opened


def test_load_refuses_a_bundle_signed_by_another_key(signed: Path, key_b: Path) -> None:
    with pytest.raises(EdgekitError, match="not a trusted key"):
        edgekit.load(signed, device="x86_64-cpu", trusted_keys=[key_b])


def test_load_refuses_unsigned_by_default_and_allows_it_loudly(
    signed: Path, tmp_path: Path, empty_trust: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    bundle = stripped(signed, tmp_path / "unsigned")
    with pytest.raises(EdgekitError) as err:
        edgekit.load(bundle, device="x86_64-cpu")
    assert "not signed" in err.value.message
    assert "trusted_keys=" in err.value.hint and "allow_unsigned=True" in err.value.hint  # Python's names
    with caplog.at_level("WARNING"), edgekit.load(bundle, device="x86_64-cpu", allow_unsigned=True) as m:
        assert m.classify(tiny_frame())
    assert "UNSIGNED" in caplog.text


def test_a_signed_bundle_with_no_key_to_check_is_not_trusted(
    signed: Path, keys: tuple[Path, Path], empty_trust: dict[str, str]
) -> None:
    with pytest.raises(EdgekitError) as err:
        edgekit.load(signed, device="x86_64-cpu")
    assert "no trusted key" in err.value.message and "trust store" in err.value.hint
    with edgekit.load(signed, device="x86_64-cpu", trusted_keys=[keys[1]]) as m:  # named: verified
        assert m.classify(tiny_frame())


def test_the_trust_store_is_where_keys_come_from_by_default(
    signed: Path, keys: tuple[Path, Path], empty_trust: dict[str, str]
) -> None:
    shutil.copy(keys[1], Path(os.environ["EDGEKIT_TRUST"]) / "builder.pub.pem")
    with edgekit.load(signed, device="x86_64-cpu") as m:
        assert m.classify(tiny_frame())


def test_load_uses_the_manifest_whose_signature_it_checked(
    signed: Path, keys: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second read of manifest.json after the check would see whatever is there by then.
    import edgekit.bundle.manifest as manifest_module

    def second_read(bundle: Path) -> Any:
        raise AssertionError("load() read manifest.json again after verifying it")

    monkeypatch.setattr(manifest_module, "read_manifest", second_read)
    monkeypatch.setattr(edgekit.bundle, "read_manifest", second_read)
    with edgekit.load(signed, device="x86_64-cpu", trusted_keys=[keys[1]]) as m:
        assert m.manifest.to_bytes() == (signed / "manifest.json").read_bytes()


def test_an_artifact_under_a_linked_folder_is_refused(
    signed: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    bundle = tmp_path / "linked"
    shutil.copytree(signed, bundle)
    art = next((bundle / "artifacts").iterdir())
    elsewhere = tmp_path / "elsewhere"
    art.rename(elsewhere)
    art.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(EdgekitError, match="link"):
        edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[keys[1]])


def tiny_frame() -> Any:
    import numpy as np

    return np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)


# -- edgekit run -----------------------------------------------------------------------------


def test_cli_run_refuses_a_stripped_signature_under_key(
    signed: Path, key_b: Path, tmp_path: Path, empty_trust: dict[str, str]
) -> None:
    bundle = stripped(signed, tmp_path / "stripped")
    r = run_bundle(empty_trust, bundle, "--key", str(key_b))
    assert r.returncode == 2, r.stderr
    assert "error:" in r.stderr and "not signed" in r.stderr and "Traceback" not in r.stderr


def test_cli_run_refuses_unsigned_by_default_and_runs_it_with_allow_unsigned(
    signed: Path, tmp_path: Path, empty_trust: dict[str, str]
) -> None:
    bundle = stripped(signed, tmp_path / "unsigned")
    r = run_bundle(empty_trust, bundle)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not signed" in r.stderr and "--allow-unsigned" in r.stderr and "--key" in r.stderr
    r = run_bundle(empty_trust, bundle, "--allow-unsigned")
    assert r.returncode == 0, r.stderr
    assert "UNSIGNED" in r.stderr  # loud: the risk is named
    assert json.loads(r.stdout)["frames"] == 3


def test_cli_run_runs_a_bundle_signed_by_the_key_given(
    signed: Path, keys: tuple[Path, Path], empty_trust: dict[str, str]
) -> None:
    r = run_bundle(empty_trust, signed, "--key", str(keys[1]))
    assert r.returncode == 0, r.stderr
    assert "UNSIGNED" not in r.stderr


def test_cli_bench_refuses_what_run_refuses(
    signed: Path, key_b: Path, tmp_path: Path, empty_trust: dict[str, str]
) -> None:
    bundle = stripped(signed, tmp_path / "stripped")
    for extra in (("--key", str(key_b)), ()):  # the bench's workers would run the bundle's native code
        r = run(empty_trust, "bench", str(bundle), "--min-queries", "1", "--min-duration", "0", *extra)
        assert r.returncode == 2 and "not signed" in r.stderr and "Traceback" not in r.stderr


# -- the agent's floor: no going back to an older signed bundle ---------------------------------


def _serial_bundle(src: Path, out: Path, key: Path, serial: int | None, version: str | None = None) -> Path:
    """The reference bundle's ONNX Runtime artifacts, re-signed with ``serial`` (None: no serial, as before,
    or as ``edgekit build --serial 0`` writes) and, given one, another ``version`` (another manifest)."""
    from deploy_bundles import keep_artifacts, resign

    keep, change = keep_artifacts(["onnxruntime-fp32", "onnxruntime-int8"])

    def edit(doc: dict[str, Any]) -> None:
        keep(doc)
        doc["build"].pop("serial", None)
        if serial is not None:
            doc["build"]["serial"] = serial

    return resign(src, out, key, edit=edit, change=change, version=version)


@pytest.fixture(scope="module")
def serials(
    x86_bundle: tuple[Path, dict[str, Any]], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("serials")
    made: list[tuple[str, int | None, str | None]] = [
        ("legacy", None, None),
        ("old", 100, None),
        ("new", 200, None),
    ]
    # Other bundles signed with serials the device has: between two it took, the same as one it took.
    made += [("mid", 150, None), ("twin", 200, "twin-of-200"), ("legacy-twin", None, "twin-of-0")]
    return {
        name: _serial_bundle(x86_bundle[0], work / name, keys[0], serial, version)
        for name, serial, version in made
    }


def agent_install(root: Path, bundle: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    r = run({**os.environ}, "agent", "install", str(bundle), "--root", str(root), "--device", "x86_64-cpu",
            "--health-runs", "10", "--json", *extra)  # fmt: skip
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    result = next((line["result"] for line in lines if "result" in line), {})
    return r.returncode, result, r.stderr


def test_the_build_stamps_a_serial_and_a_manifest_without_one_still_reads(
    x86_bundle: tuple[Path, dict[str, Any]], serials: dict[str, Path]
) -> None:
    from edgekit.bundle import read_manifest

    assert read_manifest(x86_bundle[0]).build.serial > 1_700_000_000  # UTC seconds at the build
    legacy = read_manifest(serials["legacy"])
    assert legacy.build.serial == 0 and b'"serial"' not in legacy.to_bytes()


def test_the_agent_refuses_an_older_signed_bundle_unless_the_operator_allows_it(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from edgekit.deploy import StateRoot

    root = tmp_path / "root"
    shutil.copy(keys[1], StateRoot(root).keys_dir / "builder.pub.pem")
    code, result, _ = agent_install(root, serials["legacy"])  # no serial: 0, fine on a fresh device
    assert code == 0 and result["ok"], result
    code, result, _ = agent_install(root, serials["new"])
    assert code == 0 and result["ok"], result
    for older in ("old", "legacy"):  # both signed by the trusted key, both older than the floor
        code, result, stderr = agent_install(root, serials[older])
        assert code == 1 and not result["ok"] and "Traceback" not in stderr
        assert result["step"] == "signature" and "downgrade" in result["reason"]
        assert "below this device's floor 200" in result["reason"] and "--allow-downgrade" in result["hint"]
    assert StateRoot(root).status()["version"] is not None
    code, result, _ = agent_install(root, serials["old"], "--allow-downgrade")
    assert code == 0 and result["ok"], result
    code, result, _ = agent_install(root, serials["legacy"])  # the floor stays at the newest: 200
    assert code == 1 and "downgrade" in result["reason"]


def test_rollback_to_the_other_slot_stays_allowed(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from edgekit.deploy import StateRoot

    root = tmp_path / "root"
    shutil.copy(keys[1], StateRoot(root).keys_dir / "builder.pub.pem")
    assert agent_install(root, serials["old"])[0] == 0
    assert agent_install(root, serials["new"])[0] == 0
    r = run({**os.environ}, "agent", "rollback", "--root", str(root), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    # Back on the old slot, the old bundle still cannot be installed again over the floor.
    code, result, _ = agent_install(root, serials["old"])
    assert code == 1 and "downgrade" in result["reason"]


def test_an_archive_swapped_between_the_check_and_the_unpack_is_refused(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The install checks an archive's signed manifest, then reads the archive again to unpack it:
    # what it unpacks must be the bundle it checked, not another signed one put there meanwhile.
    import edgekit.bundle
    from edgekit.bundle import pack
    from edgekit.deploy import StateRoot, install

    root = StateRoot(tmp_path / "root")
    shutil.copy(keys[1], root.keys_dir / "builder.pub.pem")
    new = pack(serials["new"], tmp_path / "new.tar.gz")
    old = pack(serials["old"], tmp_path / "old.tar.gz")
    real = edgekit.bundle.unpack
    monkeypatch.setattr(edgekit.bundle, "unpack", lambda archive, dest: real(old, dest))
    result = install(root, new, "swapped", "x86_64-cpu")
    assert not result.ok and result.step == "unpack" and "changed while it was installed" in result.reason
    assert root.active() is None and not root.slot_bundle("a").exists()


# -- the floor survives damage; a serial names one bundle ------------------------------------------


def _install(root: Any, bundle: Path, deploy_id: str, **options: Any) -> Any:
    from edgekit.deploy import install

    return install(root, bundle, deploy_id, "x86_64-cpu", health_runs=10, **options)


@pytest.fixture(scope="module")
def old_then_new(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A state root that took serial 100 (slot a), then 200 (slot b, active): copied for each test."""
    from edgekit.deploy import StateRoot

    root = StateRoot(tmp_path_factory.mktemp("old-then-new") / "root")
    shutil.copy(keys[1], root.keys_dir / "builder.pub.pem")
    assert _install(root, serials["old"], "old").ok and _install(root, serials["new"], "new").ok
    assert root.active() == "b"
    return root.path


def recover_root(root: Any) -> dict[str, Any]:
    """What the agent does at its start: ``edgekit.deploy.recover``."""
    from edgekit.deploy import recover

    result: dict[str, Any] = recover(root)
    return result


def _copy(template: Path, tmp_path: Path) -> Any:
    from edgekit.deploy import StateRoot

    shutil.copytree(template, tmp_path / "root", symlinks=True)
    return StateRoot(tmp_path / "root")


def _floor_file(root: Any) -> Any:
    return json.loads((root.path / "floor.json").read_text())["serial"]


def test_a_damaged_active_slot_never_brings_back_an_older_bundle(
    old_then_new: Path, serials: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(old_then_new, tmp_path)
    victim = next((root.slot_bundle("b") / "artifacts").rglob("*.onnx"))  # the active 200 is damaged
    victim.write_bytes(victim.read_bytes()[:1000])
    report = recover_root(root)
    # Not a silent rollback to 100: nothing is active until a bundle at or above 200 comes.
    assert report["switched"] == "none" and report["refused"] == {"a": {"serial": 100, "floor": 200}}
    assert root.active() is None and root.slot_info("a") is not None and _floor_file(root) == 200
    assert not _install(root, serials["mid"], "mid").ok
    assert _install(root, serials["new"], "new-again").ok and root.status()["version"] is not None


def test_a_lost_floor_file_and_a_damaged_slot_record_do_not_lower_the_floor(
    old_then_new: Path, serials: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(old_then_new, tmp_path)
    (root.path / "floor.json").unlink()
    (root.slot_dir("b") / "slot.json").write_text('{"damaged')
    result = _install(root, serials["mid"], "mid")  # 150 over the 200 whose records are gone
    assert not result.ok and result.step == "signature", result
    assert "below this device's floor 200" in result.reason and "--allow-downgrade" in result.hint
    assert _floor_file(root) == 200  # rebuilt from slot b's signed bundle, not reset
    # The agent's start (recover) on the same damage: slot b is cleared, slot a (100) is not made active.
    report = recover_root(root)
    assert report["cleared"].keys() == {"b"} and report["switched"] == "none" and root.active() is None
    assert not _install(root, serials["mid"], "mid-after-recover").ok  # floor.json holds it now
    assert _floor_file(root) == 200


def test_a_serial_names_one_bundle_the_same_one_goes_in_again(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from edgekit.deploy import StateRoot

    root = StateRoot(tmp_path / "root")
    shutil.copy(keys[1], root.keys_dir / "builder.pub.pem")
    assert _install(root, serials["new"], "new").ok
    twin = _install(root, serials["twin"], "twin")  # another manifest, signed with serial 200 too
    assert not twin.ok and twin.step == "signature" and "same serial 200" in twin.reason, twin
    assert root.status()["version"] != "twin-of-200"
    again = _install(root, serials["new"], "new-again")  # the very bundle: a re-install is fine
    assert again.ok and again.slot == "b", again
    assert _install(root, serials["twin"], "twin-by-operator", allow_downgrade=True).ok
    assert root.status()["version"] == "twin-of-200"


def test_bundles_without_a_serial_have_a_floor_too(
    serials: dict[str, Path], keys: tuple[Path, Path], tmp_path: Path
) -> None:
    from edgekit.deploy import StateRoot

    root = StateRoot(tmp_path / "root")
    shutil.copy(keys[1], root.keys_dir / "builder.pub.pem")
    assert _install(root, serials["legacy"], "legacy").ok  # serial 0 (edgekit build --serial 0)
    other = _install(root, serials["legacy-twin"], "legacy-twin")  # another bundle with serial 0
    assert not other.ok and "same serial 0" in other.reason, other
    assert _install(root, serials["legacy"], "legacy-again").ok
    assert _floor_file(root) == 0
