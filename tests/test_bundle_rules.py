"""One set of bundle rules, two paths: a folder's ``verify`` (and ``unpack``) and the device's streamed check.

Each bad input here is refused by both paths, for the same reason; several were once refused
by one path only (the comment on each says which), and these tests are where that shows.
The bundles are the few-byte ones of ``test_bundle``: no rule looks inside a model file.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pydantic", reason="bundles need pydantic (pip install -e '.[build]')")
pytest.importorskip("cryptography", reason="signing needs cryptography (pip install -e '.[build]')")

from test_bundle import _artifacts, _meta

from edgekit.bundle import (
    UnsafeArchiveError,
    generate_keypair,
    pack,
    read_manifest,
    unpack,
    verify,
)
from edgekit.bundle.integrity import MAX_HEADER_BYTES
from edgekit.bundle.streamed import check_archive
from edgekit.convert.bundle_writer import write_bundle
from edgekit.deploy.bundle_checks import StepFailed, check_hashes, check_signature


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "keys" / "signer")


@pytest.fixture
def signed(tmp_path: Path, keys: tuple[Path, Path]) -> Path:
    return write_bundle(tmp_path / "B", _meta(), _artifacts(tmp_path / "src"), sign_key=keys[0])


@pytest.fixture
def unsigned(tmp_path: Path) -> Path:
    return write_bundle(tmp_path / "U", _meta(), _artifacts(tmp_path / "src"))


def _archive(folder: Path, out: Path, *extra: tarfile.TarInfo, skip: str = "") -> Path:
    """``folder`` as pack writes it (header first), then the ``extra`` members (regular ones hold 6 bytes)."""
    names = [p for p in sorted(folder.rglob("*")) if p.is_file()]
    names.sort(key=lambda p: (p.parent != folder, p.as_posix()))
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for path in names:
            rel = path.relative_to(folder).as_posix()
            if rel != skip:
                tar.add(path, arcname=rel)
        for info in extra:
            data = b"pwned\n" if info.isreg() else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind == tarfile.CHRTYPE:
        info.devmajor, info.devminor = 1, 3
    return info


VICTIM = "artifacts/onnxruntime-fp32/model.onnx"

# case -> (extra members, member to leave out, the reason both paths give)
MEMBERS: dict[str, tuple[Callable[[], list[tarfile.TarInfo]], str, str]] = {
    "dotdot": (lambda: [_member("artifacts/../../evil.txt")], "", r"'\.\.' component"),
    "absolute": (lambda: [_member("/tmp/edgekit-evil.txt")], "", "absolute path"),
    # unpack once took "1:evil" (its drive pattern wanted a letter); the streamed check refused it
    "drive-like name": (lambda: [_member("1:evil.txt")], "", "absolute path"),
    # the streamed check once refused these only as "not in the manifest"
    "backslash": (lambda: [_member("artifacts\\evil.txt")], "", "NUL or backslash"),
    "symlink": (lambda: [_member(VICTIM, tarfile.SYMTYPE, "/etc/passwd")], VICTIM, "symlink"),
    "hard link": (lambda: [_member(VICTIM, tarfile.LNKTYPE, "manifest.json")], VICTIM, "hard link"),
    "device": (lambda: [_member("artifacts/null", tarfile.CHRTYPE)], "", "device file"),
    "fifo": (lambda: [_member("artifacts/pipe", tarfile.FIFOTYPE)], "", "FIFO"),
    "duplicate": (lambda: [_member(VICTIM)], "", "appears twice"),
    # unpack once skipped a regular file named "." without a word; the streamed check refused it
    "file named '.'": (lambda: [_member(".")], "", "file with no name"),
}


@pytest.mark.parametrize("case", list(MEMBERS))
def test_a_bad_member_is_refused_by_unpack_and_by_the_streamed_check_alike(
    case: str, signed: Path, tmp_path: Path
) -> None:
    extra, skip, reason = MEMBERS[case]
    tar = _archive(signed, tmp_path / "bad.tar.gz", *extra(), skip=skip)
    manifest = read_manifest(signed)
    with pytest.raises(UnsafeArchiveError, match=reason):
        unpack(tar, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(StepFailed, match=reason) as err:
        check_hashes(tar, manifest)
    assert err.value.step == "hashes" and err.value.hint
    assert not list(tmp_path.rglob("evil.txt")) and not Path("/tmp/edgekit-evil.txt").exists()


def test_the_good_archive_passes_both(signed: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    """The control: the bundle itself, packed by hand as the cases above are, passes every check."""
    tar = _archive(signed, tmp_path / "good.tar.gz")
    _, _, manifest = check_signature(tar, [keys[1]])
    check_hashes(tar, manifest)
    check_hashes(signed, manifest)
    assert verify(unpack(tar, tmp_path / "out"), [keys[1]], require_signature=True).ok


def test_the_streamed_check_caps_the_bytes_as_unpack_does(signed: Path, tmp_path: Path) -> None:
    # Once: unpack capped an archive's total bytes; the streamed check did not (a signed
    # manifest listing more than MAX_UNPACKED_BYTES was hashed in full, then refused at unpack).
    tar = pack(signed, tmp_path / "b.tar.gz")
    manifest = read_manifest(signed)
    total = sum(e.size for e in manifest.files().values())
    check_archive(tar, manifest, max_bytes=total + 100_000)
    with pytest.raises(UnsafeArchiveError, match=f"more than {total // 2:,} bytes"):
        check_archive(tar, manifest, max_bytes=total // 2)
    with pytest.raises(UnsafeArchiveError, match="more than 4 bytes"):
        unpack(tar, tmp_path / "out", max_bytes=4)


def test_a_folder_the_manifest_does_not_list_fails_everywhere(
    signed: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    # Once: the streamed check refused a folder member the manifest does not account for,
    # but verify (of a folder, or of an archive after unpack) passed an empty stray folder.
    manifest = read_manifest(signed)
    tar = _archive(signed, tmp_path / "stray.tar.gz", _member("artifacts/stray", tarfile.DIRTYPE))
    with pytest.raises(StepFailed, match="folder 'artifacts/stray' is not in the signed manifest"):
        check_hashes(tar, manifest)
    report = verify(tar, [keys[1]])
    assert not report.ok and "artifacts/stray/" in "\n".join(c.detail for c in report.failures)
    (signed / "artifacts" / "stray").mkdir()
    assert "artifacts/stray/" in verify(signed, [keys[1]]).failures[0].detail
    with pytest.raises(StepFailed, match="artifacts/stray/"):
        check_hashes(signed, manifest)


def test_an_oversized_manifest_fails_verify_as_it_fails_the_device(unsigned: Path, tmp_path: Path) -> None:
    # Once: the device refused a manifest.json over MAX_HEADER_BYTES; verify read any size.
    assert verify(unsigned).ok
    path = unsigned / "manifest.json"
    path.write_bytes(path.read_bytes() + b" " * MAX_HEADER_BYTES)  # still valid JSON, same manifest
    report = verify(unsigned)
    assert not report.ok and "larger than" in report.failures[0].detail
    with pytest.raises(StepFailed, match="larger than"):
        check_signature(unsigned, [tmp_path / "any.pub.pem"])


def test_a_linked_signature_file_fails_verify_as_it_fails_the_device(
    unsigned: Path, signed: Path, keys: tuple[Path, Path]
) -> None:
    # Once: verify took a manifest.sig that is a link for no signature at all (an unsigned
    # bundle passed with a warning); the device refused it as not a plain file.
    (unsigned / "manifest.sig").symlink_to(signed / "manifest.sig")
    report = verify(unsigned)
    assert not report.ok and "not a plain file" in report.failures[0].detail
    with pytest.raises(StepFailed, match="not a plain file"):
        check_signature(unsigned, [keys[1]])


def _edit_manifest(folder: Path, change: Callable[[dict[str, object]], None]) -> None:
    doc = json.loads((folder / "manifest.json").read_bytes())
    change(doc)
    (folder / "manifest.json").write_text(json.dumps(doc))


def _stranger(bundle: Path, work: Path) -> Path:
    """Trust only a key that did not sign ``bundle``."""
    return generate_keypair(work / "stranger")[1]


SIGNATURES: dict[str, Callable[[Path, Path], object]] = {
    "edited after signing": lambda b, _: _edit_manifest(b, lambda d: d.update(labels=["x", "y", "z"])),
    "signature deleted": lambda b, _: (b / "manifest.sig").unlink(),
    "no signer named": lambda b, _: _edit_manifest(b, lambda d: d.update(signature=None)),
    "signed by a key not trusted": _stranger,
}


@pytest.mark.parametrize("case", list(SIGNATURES))
def test_verify_and_the_device_judge_a_signature_alike(
    case: str, signed: Path, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    trusted = SIGNATURES[case](signed, tmp_path)
    key = trusted if isinstance(trusted, Path) else keys[1]
    assert not verify(signed, [key], require_signature=True).ok
    with pytest.raises(StepFailed) as err:
        check_signature(signed, [key])
    assert err.value.step == "signature" and err.value.hint
    with pytest.raises(StepFailed):
        check_signature(pack(signed, tmp_path / "s.tar.gz"), [key])
