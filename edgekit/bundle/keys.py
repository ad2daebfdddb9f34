"""Ed25519 signing keys: make a pair, load either half with a clear error, sign and check bytes.

Keys are PEM files: the private key PKCS#8 (unencrypted, mode 0600), the public key
SubjectPublicKeyInfo.  A key's id is the first 16 hex digits of SHA-256 over its raw
32-byte public key, so a manifest can say who signed it without carrying the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

from edgekit.core.io import write_atomic
from edgekit.core.paths import config_root
from edgekit.errors import KeyFileError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

PUBLIC_SUFFIX = ".pub.pem"
PRIVATE_SUFFIX = ".pem"
_INSTALL = 'pip install "edgekit[build]" (it brings cryptography)'


#: Public key files as a caller may name them: one path (``str`` or ``Path``), or several.
KeyPaths: TypeAlias = "str | os.PathLike[str] | Iterable[str | os.PathLike[str]]"


def default_key_stem() -> Path:
    """Where ``edgekit keys generate`` writes by default: outside any project, so a key is not committed."""
    return config_root() / "keys" / "edgekit"


def key_files(keys: KeyPaths | object) -> list[Path]:
    """``keys`` as a list of paths (``~`` expanded): one path or an iterable of them; ``KeyFileError`` otherwise.

    A lone ``str`` is one path, never a sequence of one-letter paths.  Anything else is checked
    here, not by the type checker alone: a script passes what it passes.
    """
    if isinstance(keys, str | os.PathLike):
        return [Path(keys).expanduser()]
    wrong = f"trusted_keys takes a path to a .pub.pem file (str or Path) or a list of them, not {type(keys).__name__}"
    example = 'for example trusted_keys="~/.config/edgekit/keys/edgekit.pub.pem"'
    if isinstance(keys, bytes) or not isinstance(keys, Iterable):
        raise KeyFileError(wrong, example)
    paths = []
    for item in keys:
        if not isinstance(item, str | os.PathLike):
            raise KeyFileError(f"{wrong} (it holds a {type(item).__name__})", example)
        paths.append(Path(item).expanduser())
    return paths


def key_paths(stem: Path) -> tuple[Path, Path]:
    """``(private, public)`` file names for ``stem``: ``STEM.pem`` and ``STEM.pub.pem``."""
    name = stem.name.removesuffix(PUBLIC_SUFFIX).removesuffix(PRIVATE_SUFFIX)
    return stem.with_name(name + PRIVATE_SUFFIX), stem.with_name(name + PUBLIC_SUFFIX)


def _serialization() -> ModuleType:
    """``cryptography``'s serialization module, or a ``KeyFileError`` saying how to install it."""
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError as err:
        raise KeyFileError(f"signing and verifying need the cryptography package ({err})", _INSTALL) from err
    return serialization


def key_id(public: Ed25519PublicKey) -> str:
    """The key's id: 16 hex digits of SHA-256 over the raw public key."""
    s = _serialization()
    raw = public.public_bytes(s.Encoding.Raw, s.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(out_stem: Path) -> tuple[Path, Path]:
    """Make an Ed25519 key pair as ``STEM.pem`` (private, 0600) and ``STEM.pub.pem``; return both paths.

    Refuses to overwrite either file: a replaced signing key would orphan every bundle
    and device that trusts the old one.
    """
    s = _serialization()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path, public_path = key_paths(out_stem)
    for p in (private_path, public_path):
        if p.exists() or p.is_symlink():
            raise KeyFileError(
                f"{p} already exists; edgekit never overwrites a key",
                "pick another --out, or move the old key away first if you mean to replace it",
            )
    _private_folder(private_path.parent)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    public_pem = key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)
    written: list[Path] = []
    try:
        for path, data, mode in ((private_path, private_pem, 0o600), (public_path, public_pem, 0o644)):
            # Created with its mode (0600: never readable by others, not even for a moment),
            # hard-linked into place: never over a key that appeared meanwhile.
            write_atomic(path, data, mode=mode, replace=False)
            written.append(path)
    except OSError as err:
        for path in written:  # only what this call made: never a key that was there before
            path.unlink(missing_ok=True)
        if isinstance(err, FileExistsError):
            raise KeyFileError(
                f"a key appeared at {out_stem} while writing; nothing was overwritten", "pick another --out"
            ) from err
        raise KeyFileError(
            f"cannot write the key pair at {out_stem}: {err}", "pick a writable --out"
        ) from err
    return private_path, public_path


KEY_DIR_MODE = 0o700


def _private_folder(folder: Path) -> None:
    """Create ``folder`` and each missing parent as 0700 exactly, whatever the umask.

    ``mkdir`` alone takes its mode from the umask: under ``umask 0`` the key's folder was
    0777, so anyone could swap the key pair for theirs between two builds.  Folders that
    were there already are the user's to set; one anybody can write into is warned about.
    """
    missing: list[Path] = []
    here = folder
    while not (here.exists() or here.is_symlink()):
        missing.append(here)
        here = here.parent
    try:
        for made in reversed(missing):
            made.mkdir(mode=KEY_DIR_MODE, exist_ok=True)  # never wider than 0700, not even for a moment
            made.chmod(KEY_DIR_MODE)  # and then exactly 0700 (the umask may have taken bits away)
        mode = folder.stat().st_mode
    except OSError as err:
        raise KeyFileError(f"cannot create the key folder {folder}: {err}", "pick a writable --out") from err
    if mode & (stat.S_IWOTH | stat.S_IWGRP) and not mode & stat.S_ISVTX:  # sticky (/tmp): files stay ours
        log.warning(
            "the key folder %s is writable by %s (mode %04o): another user could replace the key there",
            folder, "everyone" if mode & stat.S_IWOTH else "its group", stat.S_IMODE(mode),
        )  # fmt: skip


def _kind(key: object) -> str:
    return (
        type(key).__name__.removeprefix("_").replace("PrivateKey", "").replace("PublicKey", "") or "unknown"
    )


def _read(path: Path, what: str, private: bool) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError as err:
        mine = key_paths(default_key_stem())[0 if private else 1]
        hint = (
            f"edgekit keys generate wrote yours to {mine}: pass that path"
            if mine.is_file() and mine.absolute() != path.absolute()
            else "make a key pair with: edgekit keys generate"
        )
        raise KeyFileError(f"{what} {path} does not exist", hint) from err
    except OSError as err:
        raise KeyFileError(
            f"{what} {path} cannot be read: {err.strerror}", "check the path and its permissions"
        ) from err


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM file ``path``; ``KeyFileError`` saying what is wrong otherwise."""
    s = _serialization()
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read(path, "signing key", private=True)
    if b"PUBLIC KEY-----" in data:
        raise KeyFileError(
            f"{path} is a public key; signing needs the private key",
            f"pass the private half ({key_paths(path)[0].name}) to --sign-key",
        )
    try:
        key = s.load_pem_private_key(data, password=None)
    except TypeError as err:  # the key is encrypted and no password was given
        raise KeyFileError(
            f"{path} is encrypted with a passphrase; edgekit reads unencrypted keys only",
            "keep the key in a protected place instead (it is written 0600), or make one with edgekit keys generate",
        ) from err
    except (ValueError, binascii.Error, UnsupportedAlgorithm) as err:
        raise KeyFileError(
            f"{path} is not a PEM private key ({err})", "make a key pair with: edgekit keys generate"
        ) from err
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(
            f"{path} is not an Ed25519 key (it is {_kind(key)}); bundles are signed with Ed25519",
            "make an Ed25519 pair with: edgekit keys generate",
        )
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("signing key %s can be read by other users (mode %o); chmod 600 it", path, mode & 0o777)
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM file ``path``; ``KeyFileError`` saying what is wrong otherwise."""
    s = _serialization()
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    data = _read(path, "public key", private=False)
    if b"PRIVATE KEY-----" in data:
        raise KeyFileError(
            f"{path} is a private key; verifying takes the public key",
            f"pass {key_paths(path)[1].name} instead, and keep the private key on the build machine",
        )
    try:
        key = s.load_pem_public_key(data)
    except (ValueError, binascii.Error, UnsupportedAlgorithm) as err:
        raise KeyFileError(
            f"{path} is not a PEM public key ({err})",
            "pass the .pub.pem file that edgekit keys generate wrote",
        ) from err
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(
            f"{path} is not an Ed25519 key (it is {_kind(key)}); bundles are signed with Ed25519",
            "pass the .pub.pem file that edgekit keys generate wrote",
        )
    return key


def sign(key: Ed25519PrivateKey, data: bytes) -> bytes:
    """The signature file's content for ``data``: base64 of the 64-byte signature and a newline."""
    return base64.b64encode(key.sign(data)) + b"\n"


def signature_valid(public: Ed25519PublicKey, data: bytes, signature_file: bytes) -> bool:
    """True when ``signature_file`` (as ``sign`` writes it) is ``public``'s signature over ``data``."""
    from cryptography.exceptions import InvalidSignature

    try:
        raw = base64.b64decode(signature_file.strip(), validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(raw) != 64:
        return False
    try:
        public.verify(raw, data)
    except InvalidSignature:
        return False
    return True
