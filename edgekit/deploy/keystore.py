"""The device's trust store (``keys/`` of the state root) belongs to root, not to the agent.

A key in ``keys/`` lets its holder install native code on the device.  If the agent's own
user could write there, anything running as that user (a compromised pipeline, a bundle
that got through) could trust its own key and stay.  So on the system root
(``/var/lib/edgekit``) ``edgekit agent trust`` runs as root and writes each key owned by
root, mode 0644, into a root-owned 0755 ``keys/``; and an agent that is not root refuses
a trust store it could change: the folder or a key owned by it, or writable by a group or
everyone.  Replacing ``keys/`` itself (the state root is the agent's) gains nothing: the
agent cannot make a root-owned folder, so a swapped one is refused.

A root of one's own (``--root`` elsewhere, tests, a laptop) keeps working without root.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edgekit.errors import DeployError

SYSTEM_ROOT = Path("/var/lib/edgekit")
KEY_MODE = 0o644
KEYS_DIR_MODE = 0o755


def is_system_root(root: Path) -> bool:
    """Whether ``root`` is the system state root (the unit's ``/var/lib/edgekit``)."""
    return Path(root).absolute() == SYSTEM_ROOT


def trust_store_problem(keys_dir: Path, uid: int | None = None) -> str | None:
    """Why user ``uid`` (default: ours) could change the keys in ``keys_dir``, or None when it cannot.

    Root may change anything, so for root there is never a problem to report.
    """
    uid = os.geteuid() if uid is None else uid
    if uid == 0:
        return None
    paths = [keys_dir, *sorted(keys_dir.glob("*.pub.pem"))] if keys_dir.is_dir() else [keys_dir]
    for path in paths:
        try:
            st = path.stat()  # what a link points to is what is read
        except FileNotFoundError:
            continue
        if st.st_uid == uid:
            return f"{path} belongs to uid {uid}, the agent's own user"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by its group or by everyone (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def check_trust_store(root: Path, keys_dir: Path, uid: int | None = None) -> None:
    """Refuse (``DeployError``) a system root's trust store that user ``uid`` could change."""
    if not is_system_root(root):
        return
    problem = trust_store_problem(keys_dir, uid)
    if problem is not None:
        raise DeployError(
            f"the trust store {keys_dir} is not safe: {problem}, so a process running as it could trust its own keys",
            f"make it root's: sudo chown -R root:root {keys_dir} && sudo chmod 0755 {keys_dir} && "
            f"sudo chmod 0644 {keys_dir}/*.pub.pem (sudo edgekit agent trust KEY writes keys that way)",
        )


def secure_key_file(path: Path) -> None:
    """As root: ``path`` and its folder owned by root, 0644 and 0755 (a no-op for anyone else)."""
    if os.geteuid() != 0:
        return
    for target, mode in ((path.parent, KEYS_DIR_MODE), (path, KEY_MODE)):
        os.chown(target, 0, 0, follow_symlinks=False)
        target.chmod(mode)


def require_root_for(root: Path) -> None:
    """``edgekit agent trust`` on the system root: refuse unless run as root, saying how."""
    if is_system_root(root) and os.geteuid() != 0:
        raise DeployError(
            f"the trust store of {root} is root's: the agent's user must not be able to add keys",
            f"run it as root: sudo edgekit agent trust KEY.pub.pem --root {root}",
        )
