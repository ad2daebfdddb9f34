"""Bundles that a device must refuse (or whose health gate must fail), made from a real one.

Every helper copies a good bundle folder and changes one thing.  ``resign`` rewrites the
manifest's hashes and signs it again with a test key, so that the change can only be
caught by the check it is aimed at (a scrambled int8 artifact, re-hashed and re-signed,
passes signature and hash checks; only the health gate sees it answer wrongly).

The archive helpers write tar members by hand, in the order edgekit's ``pack`` uses
(``manifest.json`` and ``manifest.sig`` first), plus the one bad member.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import shutil
import tarfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from edgekit.bundle import MANIFEST_FILE, SIGNATURE_FILE, generate_keypair, key_id, load_private_key, pack
from edgekit.bundle.keys import sign
from edgekit.bundle.manifest import Manifest

ManifestEdit = Callable[[dict[str, Any]], None]

# The x86 profile's budget is 33.3 ms; on a 2-core CI box shared by several jobs, EfficientNet-Lite0
# alone takes 30-70 ms.  Test bundles carry a budget 10x above that, so only a test that means to
# break the budget does; the latency rule itself is tested with a budget nothing can meet.
CI_BUDGET_MS = 1000.0

# Each re-signed bundle is a new release, as each build is: a device refuses another bundle with
# the serial of one it took.  Serials count up from the source's, in the order bundles are made.
_NEW_SERIAL = itertools.count(1)


def _hash(path: Path) -> tuple[str, int]:
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


def resign(
    src: Path,
    out: Path,
    key: Path,
    *,
    edit: ManifestEdit | None = None,
    change: Callable[[Path], None] | None = None,
    budget_ms: float | None = CI_BUDGET_MS,
    version: str | None = None,
    serial: int | None = None,
) -> Path:
    """Copy the bundle folder ``src`` to ``out``, let ``change(out)`` alter files and ``edit`` the
    manifest (as a dict), then re-hash every listed file and sign the manifest with the private key ``key``.

    ``budget_ms`` (None: keep the bundle's) and ``version`` (None: keep it) are set in the manifest;
    ``serial`` too (None: a new one, above the source's and every one made before; ``edit`` may set its own).
    """
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out)
    if change is not None:
        change(out)
    doc = json.loads((out / MANIFEST_FILE).read_bytes())
    doc["build"]["serial"] = doc["build"].get("serial", 0) + next(_NEW_SERIAL) if serial is None else serial
    if edit is not None:
        edit(doc)
    if budget_ms is not None:
        doc["device"]["budget_ms"] = budget_ms
    if version is not None:
        doc["model"]["version"] = version
    for art in doc["artifacts"]:
        for f in art["files"]:
            f["sha256"], f["size"] = _hash(out / f["path"])
    for f in (doc.get("eval_set") or {}).get("frames", []):
        f["sha256"], f["size"] = _hash(out / f["path"])
    private = load_private_key(key)
    doc["signature"] = {"key_id": key_id(private.public_key()), "algorithm": "ed25519"}
    data = Manifest.model_validate_json(json.dumps(doc)).to_bytes()
    (out / MANIFEST_FILE).write_bytes(data)
    (out / SIGNATURE_FILE).write_bytes(sign(private, data))
    return out


def keep_artifacts(names: Iterable[str]) -> tuple[ManifestEdit, Callable[[Path], None]]:
    """An ``edit`` and a ``change`` for ``resign`` that keep only the artifacts called ``names``."""
    keep = set(names)

    def edit(doc: dict[str, Any]) -> None:
        doc["artifacts"] = [a for a in doc["artifacts"] if a["name"] in keep]

    def change(folder: Path) -> None:
        for d in (folder / "artifacts").iterdir():
            if d.name not in keep:
                shutil.rmtree(d)

    return edit, change


def ci_bundle(src: Path, out: Path, key: Path, *, version: str | None = None) -> Path:
    """The bundle as built, with the CI budget (``CI_BUDGET_MS``), re-signed with ``key``."""
    return resign(src, out, key, version=version)


def slim_bundle(
    src: Path, out: Path, key: Path, *, version: str | None = None, serial: int | None = None
) -> Path:
    """The bundle with only its ONNX Runtime artifacts (fp32 first: what x86_64-cpu selects), re-signed.

    A fifth of the size of the full x86 bundle: what the crash loop installs 50 times.
    """
    edit, change = keep_artifacts(["onnxruntime-fp32", "onnxruntime-int8"])
    return resign(src, out, key, edit=edit, change=change, version=version, serial=serial)


def scramble_onnx_weights(path: Path, seed: int = 7, *, weights: Literal["int8", "float"] = "int8") -> None:
    """Shuffle every int8 (or float) weight tensor of an ONNX model in place: it loads and runs, and answers wrongly."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    data_type = onnx.TensorProto.INT8 if weights == "int8" else onnx.TensorProto.FLOAT
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    changed = 0
    for init in model.graph.initializer:
        if init.data_type == data_type:
            arr = numpy_helper.to_array(init)
            if arr.size < 64:  # biases and constants stay: the graph must still run
                continue
            flat = arr.reshape(-1).copy()
            rng.shuffle(flat)
            init.CopyFrom(numpy_helper.from_array(flat.reshape(arr.shape), init.name))
            changed += 1
    assert changed, f"{path} has no {weights} weights to scramble"
    onnx.save(model, str(path))


def broken_int8_bundle(src: Path, out: Path, key: Path, *, version: str = "broken-int8") -> Path:
    """The bundle with only its ONNX Runtime int8 artifact, its weights scrambled, re-hashed and re-signed.

    With no fp32 artifact left, the x86_64-cpu profile's selection falls through to
    ``onnxruntime-int8`` (its fifth candidate): the artifact the health gate runs is the broken one.
    """
    edit, keep = keep_artifacts(["onnxruntime-int8"])

    def change(folder: Path) -> None:
        keep(folder)
        (model,) = (folder / "artifacts" / "onnxruntime-int8").glob("*.onnx")
        scramble_onnx_weights(model)

    return resign(src, out, key, edit=edit, change=change, version=version)


def unknown_key_bundle(src: Path, out: Path, key_dir: Path) -> Path:
    """The bundle re-signed by a brand-new key that no device trusts."""
    private, _ = generate_keypair(key_dir / "stranger")
    return resign(src, out, private)


def bad_signature_bundle(src: Path, out: Path) -> Path:
    """The bundle with its manifest changed after signing (the old signature kept)."""
    shutil.copytree(src, out)
    doc = json.loads((out / MANIFEST_FILE).read_bytes())
    doc["model"]["description"] = doc["model"]["description"] + " (edited after signing)"
    (out / MANIFEST_FILE).write_bytes(Manifest.model_validate_json(json.dumps(doc)).to_bytes())
    return out


def hash_mismatch_bundle(src: Path, out: Path) -> Path:
    """The bundle with bytes of one artifact file flipped (manifest and signature untouched)."""
    shutil.copytree(src, out)
    doc = json.loads((out / MANIFEST_FILE).read_bytes())
    victim = out / doc["artifacts"][0]["path"]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    return out


# -- archives --------------------------------------------------------------------------


def _members(folder: Path) -> list[tuple[str, Path]]:
    """The bundle's files in ``pack``'s order: top-level files first, then each folder, sorted."""
    top = sorted(p for p in folder.iterdir() if p.is_file())
    rest = sorted(p for p in folder.rglob("*") if p.is_file() and p.parent != folder)
    return [(p.relative_to(folder).as_posix(), p) for p in [*top, *rest]]


def write_tar(
    out: Path, folder: Path, extra: Iterable[tarfile.TarInfo] = (), skip: Iterable[str] = ()
) -> Path:
    """``folder`` as a .tar.gz in pack's order, without the members named in ``skip``, plus ``extra`` members."""
    skipped = set(skip)
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, path in _members(folder):
            if name not in skipped:
                tar.add(path, arcname=name)
        for info in extra:
            data = b"pwned\n" if info.isreg() else b""
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out


def tar_slip_archive(folder: Path, out: Path) -> Path:
    """A signed bundle's archive plus a member ``../../evil.txt`` (it would land outside the folder)."""
    return write_tar(out, folder, [tarfile.TarInfo("../../evil.txt")])


def absolute_path_archive(folder: Path, out: Path, target: Path) -> Path:
    """A signed bundle's archive plus a member with the absolute path ``target``."""
    return write_tar(out, folder, [tarfile.TarInfo(str(target))])


def symlink_out_archive(folder: Path, out: Path, target: str = "/etc/passwd") -> Path:
    """A signed bundle's archive whose first artifact file is a symlink to ``target`` instead."""
    doc = json.loads((folder / MANIFEST_FILE).read_bytes())
    victim = doc["artifacts"][0]["path"]
    link = tarfile.TarInfo(victim)
    link.type = tarfile.SYMTYPE
    link.linkname = target
    return write_tar(out, folder, [link], skip=[victim])


def truncated_archive(folder: Path, out: Path, keep: float = 0.6) -> Path:
    """The bundle's archive cut off after ``keep`` of its bytes: an interrupted download."""
    whole = pack(folder, out.with_name(out.name + ".whole.tar.gz"))
    data = whole.read_bytes()
    out.write_bytes(data[: int(len(data) * keep)])
    whole.unlink()
    return out
