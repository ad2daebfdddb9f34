"""Bundles: write, sign, verify, tamper, pack and unpack (safely), and the keys/verify/inspect commands.

The artifacts here are a few bytes each: the bundle code never looks inside a model file.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import pytest

pytest.importorskip("pydantic", reason="bundles need pydantic (pip install -e '.[build]')")
pytest.importorskip("cryptography", reason="signing needs cryptography (pip install -e '.[build]')")

from edgekit.bundle import (
    Accuracy,
    BuildHost,
    BuildInfo,
    BundleError,
    DeviceInfo,
    KeyFileError,
    Latency,
    ModelInfo,
    Preprocess,
    UnsafeArchiveError,
    VerificationError,
    generate_keypair,
    load_private_key,
    load_public_key,
    pack,
    read_manifest,
    unpack,
    verify,
)
from edgekit.convert.artifact import Artifact
from edgekit.convert.bundle_writer import ArtifactResults, BundleMeta, write_bundle
from edgekit.processing.preprocessing import PreprocessSpec

# ---------------------------------------------------------------- helpers


def _meta() -> BundleMeta:
    return BundleMeta(
        model=ModelInfo(
            name="tiny",
            version="1.0",
            description="a test model",
            license="Apache-2.0",
            attribution="nobody",
            source_sha256="ab" * 32,
            input="input",
            output="logits",
        ),
        preprocess=Preprocess(size=(224, 224), mean=(127.0, 127.0, 127.0), std=(128.0, 128.0, 128.0)),
        device=DeviceInfo(profile="x86_64-cpu", arch="x86_64", budget_ms=33.0),
        build=BuildInfo(
            edgekit="0.1.0",
            created=datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc),
            host=BuildHost(arch="x86_64", cpu="test cpu"),
            tools={"onnxruntime": "1.32.0"},
            accuracy_threshold=0.98,
        ),
        labels=("cat", "dog", "espresso"),
    )


def _artifacts(src: Path) -> list[tuple[Artifact, ArtifactResults]]:
    src.mkdir(parents=True, exist_ok=True)
    onnx = src / "model.onnx"
    onnx.write_bytes(b"fake onnx " * 100)
    xml, bin_ = src / "ir" / "model.xml", src / "ir" / "model.bin"
    xml.parent.mkdir(exist_ok=True)
    xml.write_bytes(b"<net/>")
    bin_.write_bytes(bytes(range(256)) * 8)
    acc = Accuracy(
        top1_agreement=35 / 36,
        max_abs_logit_diff=0.25,
        eval_images=36,
        smoke_set=True,
        passed=False,
        allowed_drop=True,
    )
    return [
        (
            Artifact(onnx, "onnxruntime", "fp32", kind="onnx", notes={"folded": True}),
            ArtifactResults(latency=Latency(p50_ms=6.0, p99_ms=7.5, runs=200)),
        ),
        (
            Artifact(
                xml, "openvino", "int8", files=(xml, bin_), kind="openvino-ir", options={"hint": "LATENCY"}
            ),
            ArtifactResults(latency=Latency(p50_ms=5.0, p99_ms=6.0), accuracy=acc),
        ),
    ]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys" / "signer")


@pytest.fixture
def signed(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    return write_bundle(tmp_path / "B", _meta(), _artifacts(tmp_path / "src"), sign_key=keys[0])


@pytest.fixture
def unsigned(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "U", _meta(), _artifacts(tmp_path / "src"))


def _leftovers(parent: Path) -> list[str]:
    """Hidden temp folders or files the bundle code might have left beside its target."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _fail_text(report: object) -> str:
    from edgekit.bundle import VerifyReport

    assert isinstance(report, VerifyReport)
    return "\n".join(f"{c.name}: {c.detail}" for c in report.failures)


# ---------------------------------------------------------------- write and verify


def test_round_trip_signed_bundle_verifies(signed: Path, keys: tuple[Path, Path]) -> None:
    files = sorted(p.relative_to(signed).as_posix() for p in signed.rglob("*") if p.is_file())
    assert files == [
        "artifacts/onnxruntime-fp32/model.onnx",
        "artifacts/openvino-int8/model.bin",  # the IR keeps its file names: the .xml names its .bin
        "artifacts/openvino-int8/model.xml",
        "manifest.json",
        "manifest.sig",
    ]
    report = verify(signed, [keys[1]])
    assert report.ok, _fail_text(report)
    assert report.signature == "verified"
    m = read_manifest(signed)
    assert m.signature is not None and report.key_id == m.signature.key_id
    assert m.labels == ("cat", "dog", "espresso") and m.device.budget_ms == 33.0
    ov = m.artifact("openvino-int8")
    assert ov.path == "artifacts/openvino-int8/model.xml" and ov.options == {"hint": "LATENCY"}
    assert ov.accuracy is not None and ov.accuracy.allowed_drop and ov.accuracy.smoke_set
    assert ov.size == 6 + 2048
    assert PreprocessSpec.from_manifest(m).input_shape == (1, 3, 224, 224)
    assert _leftovers(signed.parent) == []


def test_tampered_byte_names_the_file_and_both_hashes(signed: Path, keys: tuple[Path, Path]) -> None:
    target = signed / "artifacts/openvino-int8/model.bin"
    data = bytearray(target.read_bytes())
    data[100] ^= 1
    target.write_bytes(bytes(data))
    report = verify(signed, [keys[1]])
    assert not report.ok
    (bad,) = report.failures
    entry = read_manifest(signed).files()["artifacts/openvino-int8/model.bin"]
    import hashlib

    assert bad.name == "artifacts/openvino-int8/model.bin"
    assert entry.sha256 in bad.detail and hashlib.sha256(data).hexdigest() in bad.detail
    with pytest.raises(VerificationError, match=r"model\.bin"):
        report.raise_if_failed()


def test_missing_and_extra_files_fail(signed: Path, keys: tuple[Path, Path]) -> None:
    (signed / "artifacts/onnxruntime-fp32/model.onnx").unlink()
    (signed / "artifacts/evil.sh").write_text("echo hi\n")
    text = _fail_text(verify(signed, [keys[1]]))
    assert "artifacts/onnxruntime-fp32/model.onnx: missing" in text
    assert "extra files" in text and "artifacts/evil.sh" in text


def test_a_symlink_in_place_of_a_file_fails(signed: Path, keys: tuple[Path, Path]) -> None:
    target = signed / "artifacts/onnxruntime-fp32/model.onnx"
    copy = signed.parent / "copy.onnx"
    copy.write_bytes(target.read_bytes())
    target.unlink()
    target.symlink_to(copy)  # same bytes, but a bundle holds plain files only
    assert "not a plain file" in _fail_text(verify(signed, [keys[1]]))


def test_wrong_key_names_both_key_ids(signed: Path, tmp_path: Path) -> None:
    _, other_pub = generate_keypair(tmp_path / "other")
    report = verify(signed, [other_pub])
    m = read_manifest(signed)
    from edgekit.bundle import key_id

    other_id = key_id(load_public_key(other_pub))
    assert not report.ok and report.signature == "invalid"
    assert m.signature is not None
    assert m.signature.key_id in _fail_text(report) and other_id in _fail_text(report)


def test_edited_manifest_is_a_bad_signature_naming_the_key(signed: Path, keys: tuple[Path, Path]) -> None:
    path = signed / "manifest.json"
    path.write_text(path.read_text().replace('"budget_ms": 33.0', '"budget_ms": 50.0'))
    report = verify(signed, [keys[1]])
    m = read_manifest(signed)
    assert m.device.budget_ms == 50.0 and m.signature is not None
    assert report.signature == "invalid"
    text = _fail_text(report)
    assert "bad signature" in text and m.signature.key_id in text


def test_deleted_signature_file_fails(signed: Path, keys: tuple[Path, Path]) -> None:
    (signed / "manifest.sig").unlink()
    report = verify(signed, [keys[1]])
    assert report.signature == "missing" and "manifest.sig is missing" in _fail_text(report)


def test_signed_without_a_key_is_unchecked_and_fails_only_when_required(signed: Path) -> None:
    report = verify(signed)
    assert report.ok and report.signature == "unchecked"
    assert "not checked: pass --key" in report.checks[-1].detail
    assert not verify(signed, require_signature=True).ok


def test_unsigned_is_reported_and_fails_when_required(unsigned: Path) -> None:
    report = verify(unsigned)
    assert report.ok and report.signature == "unsigned" and report.checks[-1].status == "warn"
    required = verify(unsigned, require_signature=True)
    assert not required.ok
    (bad,) = required.failures
    assert "not signed" in bad.detail and "edgekit keys generate" in bad.hint and "--sign-key" in bad.hint


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda m: m.update(surprise=1), r"surprise: Extra inputs are not permitted"),
        (lambda m: m["device"].update(budget_ms="fast"), r"device\.budget_ms"),
        (lambda m: m.update(schema_version="1"), r"schema_version"),
        (lambda m: m.update(schema_version=2), r"(?s)schema_version 2.*upgrade edgekit"),
        (
            lambda m: m["artifacts"][0]["files"][0].update(path="../../etc/passwd"),
            r"not a plain relative path",
        ),
        (lambda m: m["artifacts"][0]["files"][0].update(sha256="xyz"), r"sha256"),
        (lambda m: m["artifacts"][0].pop("backend"), r"artifacts\.0\.backend: Field required"),
    ],
    ids=[
        "unknown-field",
        "wrong-type",
        "string-version",
        "newer-version",
        "dotdot-path",
        "bad-hash",
        "missing",
    ],
)
def test_bad_manifest_is_a_clear_error(unsigned: Path, edit: object, expected: str) -> None:
    path = unsigned / "manifest.json"
    data = json.loads(path.read_text())
    edit(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))
    with pytest.raises(BundleError, match=expected):
        read_manifest(unsigned)
    report = verify(unsigned)
    assert not report.ok and report.failures[0].name == "manifest"


def test_not_json_and_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_manifest(tmp_path)
    with pytest.raises(BundleError, match="does not exist"):
        verify(tmp_path / "nowhere")


# ---------------------------------------------------------------- writing is all or nothing


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    arts = _artifacts(tmp_path / "src")
    (tmp_path / "src" / "ir" / "model.bin").unlink()
    out = tmp_path / "out" / "B"
    with pytest.raises(BundleError, match=r"model\.bin does not exist"):
        write_bundle(out, _meta(), arts)
    assert not out.exists() and _leftovers(out.parent) == []


def test_rewrite_replaces_a_bundle_only_when_complete(tmp_path: Path, signed: Path) -> None:
    before = (signed / "manifest.json").read_bytes()
    arts = _artifacts(tmp_path / "src")
    broken = [*arts, (Artifact(tmp_path / "src" / "gone.tflite", "litert", "fp32"), ArtifactResults())]
    with pytest.raises(BundleError):
        write_bundle(signed, _meta(), broken)
    assert (signed / "manifest.json").read_bytes() == before  # the old bundle is untouched
    write_bundle(signed, _meta(), arts[:1])
    assert [a.name for a in read_manifest(signed).artifacts] == ["onnxruntime-fp32"]
    assert not (signed / "manifest.sig").exists() and verify(signed).ok
    assert _leftovers(tmp_path) == []


def test_refuses_to_replace_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(BundleError, match="not a bundle"):
        write_bundle(home, _meta(), _artifacts(tmp_path / "src"))
    assert (home / "thesis.tex").read_text() == "precious"


def test_bad_sign_key_fails_before_writing(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    with pytest.raises(KeyFileError, match="public key"):
        write_bundle(tmp_path / "B", _meta(), _artifacts(tmp_path / "src"), sign_key=keys[1])
    assert not (tmp_path / "B").exists() and _leftovers(tmp_path) == []


# ---------------------------------------------------------------- keys


def test_keys_are_pem_private_0600_and_never_overwritten(tmp_path: Path) -> None:
    private, public = generate_keypair(tmp_path / "k")
    assert (private.name, public.name) == ("k.pem", "k.pub.pem")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    load_private_key(private), load_public_key(public)
    before = private.read_bytes()
    with pytest.raises(KeyFileError, match="already exists"):
        generate_keypair(tmp_path / "k")
    assert private.read_bytes() == before


def test_keys_generate_under_umask_0_makes_a_0700_folder_and_a_0600_key(tmp_path: Path) -> None:
    # The real CLI in a process whose umask takes nothing away: the modes must not come from it.
    from conftest import EDGEKIT, ROOT

    there = tmp_path / "there"
    there.mkdir()
    there.chmod(0o755)
    stem = there / "new" / "keys" / "builder"
    r = subprocess.run([*EDGEKIT, "keys", "generate", "--out", str(stem)], capture_output=True, text=True,
                       cwd=ROOT, preexec_fn=lambda: os.umask(0), timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    for folder in (stem.parent, stem.parent.parent):  # every folder it made, not only the last
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE(stem.with_name("builder.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE(stem.with_name("builder.pub.pem").stat().st_mode) == 0o644
    assert stat.S_IMODE(there.stat().st_mode) == 0o755  # a folder that was there is the user's


def test_wrong_or_garbled_key_files(tmp_path: Path) -> None:
    private, public = generate_keypair(tmp_path / "k")
    with pytest.raises(KeyFileError, match="is a private key"):
        load_public_key(private)
    with pytest.raises(KeyFileError, match="is a public key"):
        load_private_key(public)
    garbled = tmp_path / "garbled.pem"
    garbled.write_text("-----BEGIN PUBLIC KEY-----\nnot base64!\n-----END PUBLIC KEY-----\n")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(garbled)
    with pytest.raises(KeyFileError, match="does not exist"):
        load_public_key(tmp_path / "absent.pub.pem")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = tmp_path / "ec.pub.pem"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFileError, match="Ed25519"):
        load_public_key(other)


# ---------------------------------------------------------------- archives


def test_pack_unpack_round_trip(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    tar = pack(signed, tmp_path / "dist" / "B.tar.gz")
    assert pack(signed, tmp_path / "again.tar.gz").read_bytes() == tar.read_bytes()  # reproducible
    with tarfile.open(tar) as t:
        assert sorted(t.getnames())[-2:] == ["manifest.json", "manifest.sig"]
    assert verify(tar, [keys[1]]).ok  # verify opens an archive itself
    out = unpack(tar, tmp_path / "unpacked")
    assert verify(out, [keys[1]]).ok
    assert read_manifest(out) == read_manifest(signed)
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "dist") == []


def test_write_bundle_to_a_tar_gz(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    tar = write_bundle(tmp_path / "B.tar.gz", _meta(), _artifacts(tmp_path / "src"), sign_key=keys[0])
    assert tar.is_file() and verify(tar, [keys[1]], require_signature=True).ok
    assert _leftovers(tmp_path) == []


def _evil_tar(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    """A .tar.gz with a valid manifest first (so only the evil member can be to blame), then ``members``."""
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("manifest.json")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"{}"))
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _file(name: str, data: bytes = b"pwned\n") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name: str, target: str, kind: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _device(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, b""


Member = tuple[tarfile.TarInfo, bytes]
EVIL: dict[str, tuple[Callable[[Path], list[Member]], str]] = {
    "dotdot": (lambda outside: [_file("../evil.txt")], r"'\.\.'"),
    "dotdot-nested": (lambda outside: [_file("artifacts/../../evil.txt")], r"'\.\.'"),
    "absolute": (lambda outside: [_file(str(outside / "evil.txt"))], "absolute"),
    "symlink-to-etc-passwd": (
        lambda outside: [_link("artifacts/passwd", "/etc/passwd", tarfile.SYMTYPE)],
        "symlink",
    ),
    "symlink-then-write-through": (
        lambda outside: [_link("artifacts", str(outside), tarfile.SYMTYPE), _file("artifacts/evil.txt")],
        "symlink",
    ),
    "hardlink": (lambda outside: [_link("artifacts/passwd", "/etc/passwd", tarfile.LNKTYPE)], "hard link"),
    "device": (lambda outside: [_device("artifacts/null")], "device file"),
    "duplicate": (lambda outside: [_file("artifacts/a"), _file("artifacts/a")], "twice"),
    "oversized": (lambda outside: [_file("artifacts/big.bin", b"\0" * 5000)], "more than 4,096 bytes"),
}


@pytest.mark.parametrize("stdlib_filter", [True, False], ids=["with-data-filter", "own-checks-only"])
@pytest.mark.parametrize("case", list(EVIL))
def test_unsafe_archives_are_rejected_leaving_nothing(
    tmp_path: Path, case: str, stdlib_filter: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not stdlib_filter:  # as on Python 3.10 before 3.10.12: no tarfile.data_filter
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    work = tmp_path / "work" / "deep"  # so '../evil.txt' from the temp folder lands in a watched place
    work.mkdir(parents=True)
    make, message = EVIL[case]
    tar = _evil_tar(tmp_path / f"{case}.tar.gz", *make(outside))
    dest = work / "bundle"
    with pytest.raises(UnsafeArchiveError, match=message):
        unpack(tar, dest, max_bytes=4096)
    assert not dest.exists() and list(work.iterdir()) == []
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in tmp_path.rglob("evil.txt")) == []


def test_unpack_replaces_a_bundle_only_with_a_good_archive(
    signed: Path, unsigned: Path, tmp_path: Path
) -> None:
    dest = unpack(pack(unsigned, tmp_path / "u.tar.gz"), tmp_path / "deployed")
    evil = _evil_tar(tmp_path / "evil.tar.gz", _file("../evil.txt"))
    with pytest.raises(UnsafeArchiveError):
        unpack(evil, dest)
    assert verify(dest).ok and read_manifest(dest).signature is None  # the old bundle is still there
    unpack(pack(signed, tmp_path / "s.tar.gz"), dest)
    assert read_manifest(dest).signature is not None
    assert _leftovers(tmp_path) == []


def test_too_many_members_is_rejected(tmp_path: Path) -> None:
    tar = _evil_tar(tmp_path / "many.tar.gz", *[_file(f"artifacts/{i}", b"") for i in range(20)])
    with pytest.raises(UnsafeArchiveError, match="more than 10 members"):
        unpack(tar, tmp_path / "b", max_members=10)
    assert not (tmp_path / "b").exists() and _leftovers(tmp_path) == []


def test_garbage_archive_and_archive_without_manifest(tmp_path: Path) -> None:
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(os.urandom(2000))
    with pytest.raises(BundleError, match="not a readable bundle archive"):
        unpack(junk, tmp_path / "a")
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz") as t:
        info, data = _file("artifacts/x")
        t.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"no top-level manifest\.json"):
        unpack(empty, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.tar.gz", "junk.tar.gz"]


# ---------------------------------------------------------------- the commands, run as a user runs them

_SCRIPT = Path(sys.executable).with_name("edgekit")
EDGEKIT = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "edgekit.cli"]


def edgekit(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGEKIT, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_cli_keys_verify_inspect(tmp_path: Path) -> None:
    r = edgekit("keys", "generate", "--out", tmp_path / "ci", "--json")
    assert r.returncode == 0, r.stderr
    keys = json.loads(r.stdout)
    assert Path(keys["private_key"]).name == "ci.pem" and len(keys["key_id"]) == 16
    bundle = write_bundle(
        tmp_path / "B", _meta(), _artifacts(tmp_path / "src"), sign_key=Path(keys["private_key"])
    )
    r = edgekit("verify", bundle, "--key", keys["public_key"], "--require-signature")
    assert r.returncode == 0, r.stderr
    assert "signed by trusted key" in r.stdout

    r = edgekit("verify", bundle, "--key", keys["public_key"], "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"] and report["signature"] == {"status": "verified", "key_id": keys["key_id"]}

    r = edgekit("inspect", bundle, "--json")
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["signature"]["key_id"] == keys["key_id"] and shown["signature"]["checked"] is False
    assert [a["name"] for a in shown["manifest"]["artifacts"]] == ["onnxruntime-fp32", "openvino-int8"]
    assert shown["manifest"]["artifacts"][0]["latency"]["p50_ms"] == 6.0

    r = edgekit("inspect", bundle)
    assert r.returncode == 0 and "openvino-int8" in r.stdout and "x86_64-cpu" in r.stdout

    r = edgekit("keys", "generate", "--out", tmp_path / "ci")
    assert r.returncode == 2 and "already exists" in r.stderr and "Traceback" not in r.stderr


def test_cli_failing_verify_prints_error_and_exits_2(
    signed: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    (signed / "artifacts/onnxruntime-fp32/model.onnx").write_bytes(b"swapped")
    r = edgekit("verify", signed, "--key", keys[1])
    assert r.returncode == 2
    assert "error:" in r.stderr and "model.onnx" in r.stderr and "Traceback" not in r.stderr

    r = edgekit("verify", signed, "--json", "--key", keys[1])
    assert r.returncode == 2 and json.loads(r.stdout)["ok"] is False

    evil = _evil_tar(tmp_path / "evil.tar.gz", _file("../evil.txt"))
    r = edgekit("inspect", evil)
    assert r.returncode == 2 and "'..'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "evil.txt").exists()


def test_cli_unsigned_with_require_signature_says_how_to_sign(unsigned: Path) -> None:
    r = edgekit("verify", unsigned, "--require-signature")
    assert r.returncode == 2 and "not signed" in r.stderr and "keys generate" in r.stderr
