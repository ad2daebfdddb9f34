"""Who may command an agent: signed commands, good once and for a while, and a limit on rollbacks.

The sender (``edgekit deploy --fleet ... --sign-key KEY.pem``) signs each command with
Ed25519 over its canonical JSON (``edgekit.protocol.control.signed_bytes``: the object
without ``signature``, keys sorted, no whitespace), after stamping it with ``expires_at``
and a random ``nonce``.  The agent (``CommandGuard``) checks, in order:

    whom        (``parse_command``, before these) the command names this device *and its fleet*:
                both are signed, so a command signed for ``lab/cam-1`` is refused by ``prod/cam-1``,
                and one that names no fleet (from before fleets were signed) is refused with a
                line that says so rather than taken on trust
    signature   one of the state root's trusted keys (the keys it trusts for bundles) signed it;
                an unsigned command is refused unless the agent runs with
                --allow-unsigned-commands (a lab: anyone who can publish on .../cmd commands it)
    expiry      expires_at is in the future, and not more than MAX_TTL_S away (so the nonces
                to remember are bounded in time)
    nonce       not seen before: nonces are remembered until their command expires, in
                ``<root>/command-nonces.json`` (at most MAX_NONCES; when full, new commands are
                refused until old ones expire, never forgotten early).  A nonce is *pending*
                from when its command starts until it has a final answer (``settle``): the same
                command redelivered after the agent died mid-install is run again (the install
                is crash-safe and keyed by its deploy id); once settled, it is a replay
    rollbacks   at most ``limit`` per ``window_s`` (default 3 per 10 minutes): a rollback skips
                the health gate and restarts the pipeline, so a stream of them is refused

A command whose deploy id was handled before is answered with its recorded outcome by the
agent before the nonce check (a redelivery after a crash, or a replay: either way nothing
is done again).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgekit.bundle.keys import signature_valid
from edgekit.core.io import write_atomic
from edgekit.errors import DeployError, EdgekitError
from edgekit.protocol.control import Command, loads_strict, signed_bytes, with_signature

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

log = logging.getLogger(__name__)

DEFAULT_TTL_S = 900.0  # what a sender gives a command: the rollout waits this long for results anyway
MAX_TTL_S = 7 * 86400.0  # the broker keeps a command for an agent that is away at most this long
MAX_NONCES = 4096
NONCES_FILE = "command-nonces.json"
DEFAULT_ROLLBACK_LIMIT = 3
DEFAULT_ROLLBACK_WINDOW_S = 600.0
_SIGN_HINT = "send it with edgekit deploy --fleet ... --sign-key KEY.pem (a key this device trusts)"


class CommandRefused(DeployError):
    """A well-formed command that this agent will not act on (unsigned, forged, expired, replayed, too many)."""


def sign_command(cmd: Command, key: Ed25519PrivateKey) -> Command:
    """``cmd`` with its ``signature``: Ed25519 over ``signed_bytes`` of its wire form."""
    return with_signature(cmd, key.sign)


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The sender's key (``edgekit keys generate`` wrote it)."""
    from edgekit.bundle.keys import load_private_key

    return load_private_key(path)


class CommandGuard:
    """The agent's checks of who sent a command and how often (see the module's doc)."""

    def __init__(
        self,
        state_dir: Path,
        trusted_keys: Callable[[], Sequence[Path]],
        *,
        allow_unsigned: bool = False,
        rollback_limit: int = DEFAULT_ROLLBACK_LIMIT,
        rollback_window_s: float = DEFAULT_ROLLBACK_WINDOW_S,
        max_nonces: int = MAX_NONCES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(state_dir) / NONCES_FILE
        self.trusted_keys = trusted_keys
        self.allow_unsigned = allow_unsigned
        self.rollback_limit = rollback_limit
        self.rollback_window_s = rollback_window_s
        self.max_nonces = max_nonces
        self.clock = clock
        self._lock = threading.Lock()
        self._nonces, self._pending = self._load()
        self._rollbacks: list[float] = []

    def warn(self, cmd_topic: str, has_origins: bool) -> None:
        """Say loudly, when the agent starts, what its configuration leaves open or shut."""
        if not has_origins:
            log.warning("agent: no --artifact-origin: every deploy command will be refused")
        if self.allow_unsigned:
            log.warning(
                "agent: --allow-unsigned-commands: ANYONE WHO CAN PUBLISH ON %s COMMANDS THIS DEVICE "
                "(a lab only; sign commands with edgekit deploy --sign-key)",
                cmd_topic,
            )

    # -- the nonces file ---------------------------------------------------------------------

    def _load(self) -> tuple[dict[str, float], dict[str, str]]:
        try:
            body = loads_strict(self.path.read_bytes(), limit=64 * 1024 * 1024)
        except FileNotFoundError:
            return {}, {}
        except (OSError, ValueError) as err:
            # Forgetting nonces would let a replay through: refuse to start without them.
            raise DeployError(
                f"{self.path} cannot be read ({err})",
                "it remembers the commands already taken; remove it only if no signed command "
                f"sent in the last {MAX_TTL_S / 86400:g} days could be replayed",
            ) from err
        nonces = body.get("nonces") if isinstance(body, dict) else None
        pending = body.get("pending") if isinstance(body, dict) else None
        if not isinstance(nonces, dict):
            return {}, {}
        kept = {
            str(k): float(v)
            for k, v in nonces.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        started = pending if isinstance(pending, dict) else {}
        return kept, {str(k): v for k, v in started.items() if isinstance(v, str) and str(k) in kept}

    def _save(self) -> None:
        body = {"nonces": self._nonces, "pending": self._pending}
        write_atomic(self.path, json.dumps(body, separators=(",", ":")).encode(), mode=0o600)

    # -- the checks --------------------------------------------------------------------------

    def authenticate(self, payload: bytes, cmd: Command) -> None:
        """Signature and expiry of ``cmd`` (parsed from ``payload``); raises ``CommandRefused``."""
        if cmd.signature is None:
            if not self.allow_unsigned:
                raise CommandRefused("refused: the command is not signed", _SIGN_HINT)
        else:
            body = loads_strict(payload)  # parse_command read it already: it is a JSON object
            data = signed_bytes(body)
            keys = self._public_keys()
            if not any(signature_valid(k, data, cmd.signature.encode()) for k in keys):
                raise CommandRefused(
                    "refused: the command's signature is not from a trusted key",
                    _SIGN_HINT + "; trust its .pub.pem with edgekit agent trust",
                )
        now = self.clock()
        if cmd.signature is not None and (cmd.expires_at is None or cmd.nonce is None):
            raise CommandRefused("refused: a signed command needs expires_at and a nonce", _SIGN_HINT)
        if cmd.expires_at is not None:
            if cmd.expires_at <= now:
                raise CommandRefused(
                    "refused: the command expired",
                    "send it again (a command is good for the rollout's timeout); check this device's clock",
                )
            if cmd.expires_at > now + MAX_TTL_S:
                raise CommandRefused(
                    f"refused: the command expires more than {MAX_TTL_S / 86400:g} days from now",
                    "check the sender's clock",
                )

    def take_nonce(self, cmd: Command) -> None:
        """Remember ``cmd``'s nonce until it expires; ``CommandRefused`` if it was seen before.

        A nonce still pending for this same deploy id is the agent's own unfinished command,
        redelivered after a restart: it is taken again.
        """
        if cmd.nonce is None:
            return
        now = self.clock()
        with self._lock:
            self._nonces = {n: t for n, t in self._nonces.items() if t > now}
            self._pending = {n: i for n, i in self._pending.items() if n in self._nonces}
            if cmd.nonce in self._nonces:
                if self._pending.get(cmd.nonce) == cmd.id:
                    log.info("agent: %s %s was cut short (a restart): running it again", cmd.action, cmd.id)
                    return
                raise CommandRefused("refused: the command was taken before (a replay)", "send a new command")
            if len(self._nonces) >= self.max_nonces:
                raise CommandRefused(
                    f"refused: {self.max_nonces} commands are waiting for their nonces to expire",
                    "send fewer commands, or ones that expire sooner",
                )
            self._nonces[cmd.nonce] = float(cmd.expires_at if cmd.expires_at is not None else now + MAX_TTL_S)
            self._pending[cmd.nonce] = cmd.id
            self._save()

    def settle(self, cmd: Command) -> None:
        """``cmd`` has its final answer (done, failed or refused): from now on its nonce is a replay."""
        if cmd.nonce is None:
            return
        with self._lock:
            if self._pending.pop(cmd.nonce, None) is not None:
                self._save()

    def take_rollback(self) -> None:
        """Count one rollback; ``CommandRefused`` when the window already holds ``rollback_limit``."""
        now = time.monotonic()
        with self._lock:
            self._rollbacks = [t for t in self._rollbacks if now - t < self.rollback_window_s]
            if len(self._rollbacks) >= self.rollback_limit:
                wait = self.rollback_window_s - (now - self._rollbacks[0])
                raise CommandRefused(
                    f"refused: more than {self.rollback_limit} rollbacks in {self.rollback_window_s:g} s",
                    f"wait {wait:.0f} s, or raise the agent's --rollback-limit",
                )
            self._rollbacks.append(now)

    def _public_keys(self) -> list[Ed25519PublicKey]:
        from edgekit.bundle.keys import load_public_key

        out = []
        for path in list(self.trusted_keys())[:64]:
            try:
                out.append(load_public_key(path))
            except EdgekitError as err:  # one unreadable key must not hide the others
                log.warning("agent: trusted key %s is unusable: %s", path, err)
        return out
