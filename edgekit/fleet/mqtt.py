"""``FleetSubscriber``: the collector's MQTT side — subscribe to the fleet's topics, feed ``Collector.handle``.

It subscribes with QoS 1 to ``edgekit/v1/#`` and ``spBv1.0/#`` on a persistent session
(``clean_session=False`` and a fixed client id), so that while the collector restarts the
broker keeps its messages instead of dropping them; de-duplication makes redelivery harmless.
Messages are handled on paho's network thread, one at a time, in arrival order.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from edgekit.errors import TelemetryError
from edgekit.telemetry.broker import BrokerConfig

log = logging.getLogger(__name__)

TOPICS = ("edgekit/v1/#", "spBv1.0/#")


class FleetSubscriber:
    """Connects to ``broker`` and hands every message to ``handle(topic, payload)``."""

    def __init__(
        self,
        broker: BrokerConfig,
        handle: Any,
        client_id: str = "edgekit-fleet-collector",
        topics: tuple[str, ...] = TOPICS,
    ) -> None:
        self.broker = broker
        self.handle = handle
        self.client_id = client_id
        self.topics = topics
        self.connected = threading.Event()
        self.last_error = ""
        self.messages = 0
        self.handler_errors = 0
        self._client = self._make_client()

    def _make_client(self) -> Any:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        b = self.broker
        v5 = b.protocol == "5"
        kwargs: dict[str, Any] = {
            "callback_api_version": CallbackAPIVersion.VERSION2,
            "client_id": self.client_id,
            "protocol": mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        }
        if not v5:
            kwargs["clean_session"] = False
        client = mqtt.Client(**kwargs)
        # The broker, not paho's in-memory queue, is where unread messages wait.
        client.max_inflight_messages_set(1000)
        if b.username:
            client.username_pw_set(b.username, b.password)
        if b.tls:
            try:
                client.tls_set(
                    ca_certs=str(b.ca_file) if b.ca_file else None,
                    certfile=str(b.cert_file) if b.cert_file else None,
                    keyfile=str(b.key_file) if b.key_file else None,
                )
            except (OSError, ValueError) as err:
                raise TelemetryError(
                    f"TLS setup for {b.describe()} failed: {err}", "check the CA/cert/key files"
                ) from err
        client.reconnect_delay_set(min_delay=1, max_delay=5)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            self.last_error = f"{self.broker.describe()} refused the connection: {reason}"
            log.error("fleet: %s (check the user, password and ACL)", self.last_error)
            return
        self.last_error = ""
        client.subscribe([(t, 1) for t in self.topics])
        log.info("fleet: subscribed to %s on %s", ", ".join(self.topics), self.broker.describe())
        self.connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.connected.clear()
        if getattr(reason, "is_failure", False):
            log.warning("fleet: lost %s (%s); reconnecting", self.broker.describe(), reason)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        self.messages += 1
        try:
            self.handle(msg.topic, msg.payload)
        except Exception:  # an exception here would end paho's network thread: no more messages
            self.handler_errors += 1
            log.exception("fleet: handling a message on %r failed", msg.topic[:200])

    def start(self, wait_s: float = 10.0) -> FleetSubscriber:
        """Connect and start paho's network thread; raises ``TelemetryError`` if the broker is not there."""
        b = self.broker
        try:
            self._client.connect(b.host, b.port, keepalive=b.keepalive_s)
        except OSError as err:
            raise TelemetryError(
                f"cannot reach the MQTT broker {b.describe()}: {err}",
                "start the broker (e.g. `mosquitto -p 1883`) or pass --mqtt mqtt://host:port",
            ) from err
        self._client.loop_start()
        if not self.connected.wait(wait_s):
            self.stop()
            raise TelemetryError(
                f"{b.describe()} did not accept the collector within {wait_s:g} s: {self.last_error or 'no answer'}",
                "check the broker's listener, user, password and ACL",
            )
        return self

    def stop(self) -> None:
        """Disconnect and end the network thread."""
        try:
            self._client.disconnect()
        finally:
            self._client.loop_stop()
