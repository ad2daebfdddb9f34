"""edgekit.core.io: atomic writes, hashing, removing folders."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from edgekit.core.io import CHUNK, atomic_path, digest_file, remove_tree, sha256_file, write_atomic
from edgekit.core.paths import cache_root, state_root


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_atomic_writes_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "a.json"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert _names(tmp_path) == ["a.json"]


def test_write_atomic_keeps_old_content_when_replace_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_bytes(b"old")

    def boom(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["a.json"]  # no temp file left behind


def test_write_atomic_keeps_old_content_when_write_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "a.json"
    target.write_bytes(b"old")

    def boom(fd: int) -> None:
        raise OSError("fsync failed")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="fsync failed"):
        write_atomic(target, b"new" * 1000)
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["a.json"]


def test_write_atomic_fsyncs_file_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[bool] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    write_atomic(tmp_path / "f", b"x")
    assert synced == [False, True]


def test_write_atomic_mode_from_creation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[int] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, mode: int = 0o777, **kw: object) -> int:
        if flags & os.O_CREAT:
            created.append(mode)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0o077)
    try:
        write_atomic(tmp_path / "key.pem", b"secret", mode=0o600)
        write_atomic(tmp_path / "key.pub.pem", b"public", mode=0o644)  # exactly, whatever the umask
    finally:
        os.umask(old)
    assert created == [0o600, 0o644]  # never wider than asked, not even before a chmod
    assert stat.S_IMODE((tmp_path / "key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "key.pub.pem").stat().st_mode) == 0o644


def test_write_atomic_no_replace_refuses_existing(tmp_path: Path) -> None:
    target = tmp_path / "key.pem"
    target.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write_atomic(target, b"new", mode=0o600, replace=False)
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["key.pem"]
    write_atomic(tmp_path / "other.pem", b"new", replace=False)
    assert (tmp_path / "other.pem").read_bytes() == b"new"
    assert _names(tmp_path) == ["key.pem", "other.pem"]


def test_sha256_file_multi_chunk(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 12345)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert digest_file(path) == (hashlib.sha256(data).hexdigest(), len(data))


def test_atomic_path_success(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with atomic_path(target, suffix=".onnx") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".") and tmp.suffix == ".onnx"
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"
    assert target.read_bytes() == b"new"
    assert _names(tmp_path) == ["model.onnx"]


def test_atomic_path_removes_temp_on_exception(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("exporter crashed")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["model.onnx"]
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.mkdir()  # a writer that made a folder there
        (tmp / "x").write_bytes(b"x")
        raise RuntimeError("exporter crashed")
    assert _names(tmp_path) == ["model.onnx"]


def test_remove_tree(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "f").write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(folder)
    remove_tree(link)  # the link, never what it points at
    assert not link.is_symlink() and (folder / "sub" / "f").exists()
    remove_tree(folder)
    remove_tree(tmp_path / "missing")
    assert _names(tmp_path) == []


def test_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    monkeypatch.delenv("EDGEKIT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "edgekit"


def test_state_root_is_not_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGEKIT_STATE", str(tmp_path / "state"))
    assert state_root() == tmp_path / "state"
    monkeypatch.delenv("EDGEKIT_STATE")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_root() == tmp_path / "xdg" / "edgekit"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.delenv("EDGEKIT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_root() == tmp_path / "home" / ".local" / "state" / "edgekit" != cache_root()


def test_a_spool_left_in_the_cache_by_an_earlier_version_is_still_replayed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from edgekit.telemetry.spool import default_spool

    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGEKIT_STATE", str(tmp_path / "state"))
    assert default_spool("lab", "cam-1") == tmp_path / "state" / "telemetry" / "lab-cam-1.db"
    earlier = tmp_path / "cache" / "telemetry" / "lab-cam-1.db"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"")
    assert default_spool("lab", "cam-1") == earlier
