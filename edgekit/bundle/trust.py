"""Which keys a bundle that is about to run must be signed by, and the one rule that decides.

A bundle carries native code (a TVM ``.so`` runs its constructors as it loads), so loading
one is running code: ``edgekit.load`` and ``edgekit run`` require a valid signature by a
trusted key unless the caller explicitly allows an unsigned bundle.

*Trusted keys* are the ones the caller passes (``--key``, ``trusted_keys=``); when it passes
none, the trust store: every ``*.pub.pem`` in ``$EDGEKIT_TRUST`` (folders separated by
``:``), else in ``$XDG_CONFIG_HOME/edgekit/trusted-keys`` (``~/.config/edgekit/trusted-keys``)
and in the folder ``edgekit keys generate`` writes to (``~/.config/edgekit/keys``: a bundle
you signed yourself runs here, whether through the CLI or ``edgekit.load``), plus the device
agent's own store ``<agent root>/keys`` (``$EDGEKIT_AGENT_ROOT``, else ``/var/lib/edgekit``)
when it is readable.  Keys passed explicitly replace the store: only they count.  A bundle
signed by a key that is in neither is refused, never run as if checked.

Trusting the generated keys' folder widens nothing: it is made 0700 beside ``trusted-keys``,
in the same config folder, so whoever could put a key in one could put it in the other.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from edgekit.bundle.keys import KeyPaths, default_key_stem, key_files
from edgekit.core.paths import config_root
from edgekit.errors import VerificationError, spelled

log = logging.getLogger(__name__)

AGENT_ROOT = Path("/var/lib/edgekit")
UNSIGNED_RISK = (
    "running an UNSIGNED bundle (--allow-unsigned): nothing proves who built it, and its native "
    "code (a TVM .so runs as it loads) runs with your privileges"
)


def user_trust_dirs() -> list[Path]:
    """This user's part of the trust store: ``$EDGEKIT_TRUST``'s folders, else ``trusted-keys`` and
    the folder ``edgekit keys generate`` writes to, in the config folder."""
    env = os.environ.get("EDGEKIT_TRUST")
    if env is not None:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [config_root() / "trusted-keys", default_key_stem().parent]


def trust_dirs() -> list[Path]:
    """The trust store's folders, in order (they need not exist): the user's, then the agent's."""
    agent = os.environ.get("EDGEKIT_AGENT_ROOT")
    return [*user_trust_dirs(), (Path(agent).expanduser() if agent else AGENT_ROOT) / "keys"]


def store_keys() -> list[Path]:
    """Every readable ``*.pub.pem`` in the trust store (a folder that is missing or unreadable adds none)."""
    found: list[Path] = []
    for folder in trust_dirs():
        try:
            found += sorted(p for p in folder.glob("*.pub.pem") if p.is_file())
        except OSError:
            continue
    return found


def keys_for(trusted_keys: KeyPaths | None) -> tuple[list[Path], bool]:
    """``(keys, explicit)``: the keys passed (one path or several; an empty list trusts nothing),
    else (None) the trust store's."""
    if trusted_keys is not None:
        return key_files(trusted_keys), True
    return store_keys(), False


def _key_option() -> str:
    return spelled(cli="--key KEY.pub.pem", python='trusted_keys="KEY.pub.pem"')


def trust_hint(explicit: bool) -> str:
    where = ", ".join(str(d) for d in trust_dirs())
    if explicit:
        return f"pass the public key of the key that signed it: {_key_option()}"
    return (
        f"pass the builder's public key ({_key_option()}), or put it in the trust store ({where}); "
        f"to run it anyway, unchecked, pass {spelled(cli='--allow-unsigned', python='allow_unsigned=True')}"
    )


def require_trusted(
    shown: Path, signature: str | None, key_id: str | None, *, explicit: bool, allow_unsigned: bool
) -> None:
    """Refuse (``VerificationError``) a bundle that is not signed by a trusted key, unless ``allow_unsigned``.

    ``signature`` is ``VerifyReport.signature`` of a report that otherwise passed.  Keys
    passed explicitly (``explicit``) mean "signed by one of these": nothing else passes.
    Otherwise ``allow_unsigned`` lets an unsigned (or unchecked) bundle pass, with a warning
    naming the risk.
    """
    if signature == "verified":
        return
    if signature == "unsigned":
        what = f"{shown} is not signed; edgekit runs only bundles signed by a trusted key"
        hint = "build it with --sign-key KEY.pem (edgekit keys generate makes one); " + trust_hint(explicit)
    elif signature == "unchecked":
        what = (
            f"{shown} is signed by key {key_id}, but no trusted key was given or found to check it "
            "against, so nothing proves it is that key's"
        )
        hint = trust_hint(explicit)
    else:  # invalid / missing: verify already failed on these
        raise VerificationError(f"{shown}: signature {signature}", trust_hint(explicit))
    if explicit:  # keys were named: it must be signed by one of them, whatever else was allowed
        given, allow = spelled(cli=("--key", "--allow-unsigned"), python=("trusted_keys", "allow_unsigned"))
        raise VerificationError(
            what + f"; keys were given ({given}), so it must be signed by one of them "
            f"({allow} does not override {given})",
            hint,
        )
    if not allow_unsigned:
        raise VerificationError(what, hint)
    log.warning("%s: %s", shown, UNSIGNED_RISK)
