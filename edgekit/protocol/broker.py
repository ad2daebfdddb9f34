"""Where telemetry goes: an ``mqtt[s]://[user@]host[:port]`` URL, TLS files, protocol version.

The password is not part of the URL one passes: it comes from ``EDGEKIT_MQTT_PASSWORD`` or,
under systemd, from the credential ``mqtt-password`` (``LoadCredential=mqtt-password:/etc/...``
puts it in ``$CREDENTIALS_DIRECTORY``), so that it never reaches a command line, where
``ps`` and ``/proc/<pid>/cmdline`` show it to every user.  A password in the URL still
works, with a warning when that URL is on our command line.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from edgekit.core.redact import redact_url, warn_secret_on_command_line
from edgekit.errors import TelemetryError

log = logging.getLogger(__name__)

PROTOCOLS = ("3.1.1", "5")
PASSWORD_ENV = "EDGEKIT_MQTT_PASSWORD"
CREDENTIAL = "mqtt-password"  # the file's name in $CREDENTIALS_DIRECTORY (systemd LoadCredential=)


def password_from_environment() -> str | None:
    """``EDGEKIT_MQTT_PASSWORD``, else the systemd credential ``mqtt-password`` (its first line), else None."""
    password = os.environ.get(PASSWORD_ENV)
    if password:
        return password
    folder = os.environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        return None
    try:
        text = (Path(folder) / CREDENTIAL).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise TelemetryError(
            f"cannot read the MQTT password from {Path(folder) / CREDENTIAL}: {err}",
            "check the unit's LoadCredential=mqtt-password:<file> and that file",
        ) from err
    return text.splitlines()[0] if text.strip() else None


def warn_if_on_command_line(url: str, argv: list[str] | None = None) -> bool:
    """Warn (once, without the password) when ``url`` holds a password and is on our command line."""
    if not urlsplit(url).password:
        return False
    return warn_secret_on_command_line(
        url,
        "the MQTT password in",
        f"put it in {PASSWORD_ENV} or a systemd credential (LoadCredential={CREDENTIAL}:<file>) "
        "and give the URL without it",
        argv=argv,
        logger=log,
    )


@dataclass(frozen=True)
class BrokerConfig:
    """An MQTT broker and how to talk to it.  The password comes from ``password_from_environment()``."""

    host: str
    port: int
    tls: bool = False
    username: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    protocol: str = "3.1.1"
    keepalive_s: int = 30

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        ca_file: Path | None = None,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        protocol: str = "3.1.1",
    ) -> BrokerConfig:
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise TelemetryError(
                f"not an MQTT broker URL: {redact_url(url)!r}",
                "write mqtt://host:1883 or mqtts://user@host:8883 (the password comes from EDGEKIT_MQTT_PASSWORD)",
            )
        if protocol not in PROTOCOLS:
            raise TelemetryError(f"unknown MQTT protocol version {protocol!r}", "use 3.1.1 or 5")
        tls = parts.scheme == "mqtts" or ca_file is not None
        try:
            port = parts.port or (8883 if tls else 1883)
        except ValueError as err:
            raise TelemetryError(
                f"bad port in {redact_url(url)!r}: {err}", "a port is a number, e.g. :1883"
            ) from err
        for what, path in (("CA file", ca_file), ("client certificate", cert_file), ("client key", key_file)):
            if path is not None and not Path(path).is_file():
                raise TelemetryError(
                    f"{what} {path} does not exist", "give the PEM file the broker's TLS setup uses"
                )
        if parts.password:
            warn_if_on_command_line(url)
        password = unquote(parts.password) if parts.password else password_from_environment()
        return cls(
            host=parts.hostname,
            port=port,
            tls=tls,
            username=unquote(parts.username) if parts.username else None,
            password=password,
            ca_file=ca_file,
            cert_file=cert_file,
            key_file=key_file,
            protocol=protocol,
        )

    def secure(self, client: Any) -> None:
        """Give a paho client this broker's user, password and TLS files (``TelemetryError`` if unusable)."""
        if self.username:
            client.username_pw_set(self.username, self.password)
        if not self.tls:
            return
        try:
            client.tls_set(
                ca_certs=str(self.ca_file) if self.ca_file else None,
                certfile=str(self.cert_file) if self.cert_file else None,
                keyfile=str(self.key_file) if self.key_file else None,
            )
        except (OSError, ValueError) as err:
            raise TelemetryError(
                f"TLS setup for {self.describe()} failed: {err}", "check the CA/cert/key files"
            ) from err

    def client(self, client_id: str, *, clean_session: bool = True, max_delay_s: int = 5) -> Any:
        """A paho client for this broker: its MQTT version, user, password, TLS files, reconnect back-off.

        Every edgekit MQTT client is made here (paho's callback API version 2).
        ``clean_session`` applies to MQTT 3.1.1 only; ``max_delay_s`` caps the reconnect back-off.
        """
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        v5 = self.protocol == "5"
        kwargs: dict[str, Any] = {
            "callback_api_version": CallbackAPIVersion.VERSION2,
            "client_id": client_id,
            "protocol": mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        }
        if not v5:
            kwargs["clean_session"] = clean_session
        client = mqtt.Client(**kwargs)
        self.secure(client)
        client.reconnect_delay_set(min_delay=1, max_delay=max_delay_s)
        return client

    def describe(self) -> str:
        who = f"{self.username}@" if self.username else ""
        return f"{'mqtts' if self.tls else 'mqtt'}://{who}{self.host}:{self.port} (MQTT {self.protocol})"


def drop_unsent(client: Any) -> int:
    """Forget the QoS 1 messages a paho client would send again on its next connection; how many.

    paho resends a lost session's unacknowledged messages first thing after a reconnect.  A
    Sparkplug node must not: they carry the dead session's ``seq`` and would reach host
    applications after the NDEATH and before the new NBIRTH.  The telemetry spool sends those
    windows again itself, after the births.  (paho has no public call for this; a paho
    without these attributes keeps its resends: duplicates, never a loss.)
    """
    lock, queued = getattr(client, "_out_message_mutex", None), getattr(client, "_out_messages", None)
    if lock is None or queued is None or not hasattr(queued, "clear"):
        return 0
    with lock:
        dropped = len(queued)
        queued.clear()
        if hasattr(client, "_inflight_messages"):
            client._inflight_messages = 0
    return dropped
