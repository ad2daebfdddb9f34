"""``edgekit telemetry tail``: watch what devices publish, live in a terminal or as JSON lines.

Payloads come from the network: they are parsed as JSON and nothing else, and a field
of the wrong type shows as ``-`` rather than breaking the view.  The ``seen`` column is the
newest labels message: a classifier's labels, or a detector's detections (class, score, box).
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from edgekit.commands.common import MqttCaOpt, console, err_console
from edgekit.errors import TelemetryError

telemetry_app = typer.Typer(help="Telemetry devices publish over MQTT.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(telemetry_app, name="telemetry")


def _num(value: Any, fmt: str = "{:.1f}") -> str:
    return fmt.format(value) if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _quantile(sketch: Any, q: float) -> float | None:
    from edgekit.core.sketch import LatencySketch

    try:
        value = LatencySketch.from_dict(sketch).quantile(q)
    except (ValueError, TypeError):
        return None
    return None if math.isnan(value) else value


#: How many of a frame's detections (or labels) a row shows; the rest as ``+N``.
SHOWN = 3


def _seen(body: Any) -> str:
    """What a labels message says the model saw, in one short cell.

    A detector's message carries ``detections`` (its ``labels`` are empty, for receivers from
    before detection): ``face 0.93 [10,20,40,60]``, best first, or ``nothing`` for a frame
    without one.  A classifier's: ``tabby 0.81, tiger_cat 0.12``.  Anything malformed is ``?``.
    """
    if not isinstance(body, dict):
        return "-"
    detections = body.get("detections")
    if isinstance(detections, list):
        if not detections:
            return "nothing"
        shown = [_detection(d) for d in detections[:SHOWN]]
        more = len(detections) - SHOWN
        return "; ".join(shown) + (f" +{more}" if more > 0 else "")
    labels = body.get("labels")
    if isinstance(labels, list) and labels:
        return ", ".join(
            f"{d.get('name', '?')} {_num(d.get('score'), '{:.2f}')}" if isinstance(d, dict) else "?"
            for d in labels[:SHOWN]
        )
    return "-"


def _detection(d: Any) -> str:
    """``face 0.93 [10,20,40,60]``: class, score and box (frame pixels) of one detection."""
    if not isinstance(d, dict):
        return "?"
    box = d.get("box")
    corners = (
        "[" + ",".join(_num(v, "{:.0f}") for v in box) + "]"
        if isinstance(box, list) and len(box) == 4
        else "[?]"
    )
    return f"{d.get('name', '?')} {_num(d.get('score'), '{:.2f}')} {corners}"


class TailView:
    """The newest status and telemetry per device; a rich table of them."""

    def __init__(self) -> None:
        self.devices: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.messages = 0

    def add(self, topic: str, body: dict[str, Any]) -> None:
        parts = topic.split("/")
        if len(parts) != 5:
            return
        key = f"{parts[2]}/{parts[3]}"
        with self.lock:
            self.messages += 1
            entry = self.devices.setdefault(key, {})
            entry[parts[4]] = body
            entry["seen"] = time.time()

    def __rich__(self) -> Table:
        table = Table(title=f"edgekit fleet · {self.messages} messages", title_justify="left")
        for row in self.rows():
            if not table.columns:
                for col in row:
                    table.add_column(col)
            # Every cell is a device's own words (class names too): shown, never read as markup.
            row = {k: escape(v) for k, v in row.items()}
            state = row["state"]
            row["state"] = f"[green]{state}[/]" if state == "online" else f"[red]{state}[/]"
            table.add_row(*row.values())
        return table

    def lines(self) -> list[str]:
        """One plain line per device (for logs and pipes)."""
        return [" ".join(f"{k.replace(' ', '_')}={v}" for k, v in row.items()) for row in self.rows()]

    def rows(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = []
        with self.lock:
            items = sorted(self.devices.items())
        for key, entry in items:
            status = entry.get("status", {})
            tel = entry.get("telemetry", {})
            window = tel.get("window") if isinstance(tel.get("window"), dict) else {}
            counters = tel.get("counters") if isinstance(tel.get("counters"), dict) else {}
            gauges = tel.get("gauges") if isinstance(tel.get("gauges"), dict) else {}
            state = str(status.get("state", "?"))
            model = status.get("model") if isinstance(status.get("model"), dict) else {}
            temps = gauges.get("temperature_c")
            hottest = (
                max((v for v in temps.values() if isinstance(v, int | float)), default=None)
                if isinstance(temps, dict)
                else None
            )
            out.append(
                {
                    "device": key,
                    "state": state,
                    "model": f"{model.get('name', '-')} · {status.get('candidate', '-')}",
                    "seq": _num(tel.get("seq"), "{}"),
                    "fps": _num(window.get("fps")),
                    "p50 ms": _num(_quantile(window.get("latency_ms"), 0.5), "{:.2f}"),
                    "p99 ms": _num(_quantile(window.get("latency_ms"), 0.99), "{:.2f}"),
                    "misses": _num(counters.get("missed"), "{}"),
                    "drops": _num(counters.get("dropped"), "{}"),
                    "cpu %": _num(gauges.get("cpu_percent")),
                    "temp °C": _num(hottest),
                    "seen": _seen(entry.get("labels")),
                }
            )
        return out


@telemetry_app.command("tail")
def tail_command(
    mqtt: Annotated[str, typer.Option("--mqtt", help="The broker: mqtt[s]://[user@]host[:port].")],
    fleet: Annotated[str, typer.Option("--fleet", help="Only this fleet (default: every fleet).")] = "+",
    ca_file: MqttCaOpt = None,
    duration: Annotated[float | None, typer.Option("--duration", help="Stop after S seconds.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON line per message: topic, retain, payload.")
    ] = False,
) -> None:
    """Show what devices publish: a live table per device, or JSON lines with --json."""
    from edgekit.protocol.broker import BrokerConfig
    from edgekit.protocol.topics import topic

    broker = BrokerConfig.from_url(mqtt, ca_file=ca_file)
    view = TailView()
    refused: list[str] = []
    out_lock = threading.Lock()

    def on_connect(client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if reason.is_failure:
            refused.append(str(reason))
            return
        client.subscribe(topic(fleet, "+", "+"), qos=1)

    def on_message(client: Any, userdata: Any, msg: Any) -> None:
        try:
            body = json.loads(msg.payload)
        except ValueError:
            return  # not ours, or garbled: never evaluated, just skipped
        if not isinstance(body, dict):
            return
        if as_json:
            with out_lock:
                sys.stdout.write(
                    json.dumps({"topic": msg.topic, "retain": bool(msg.retain), "payload": body}) + "\n"
                )
                sys.stdout.flush()
        view.add(msg.topic, body)

    client = broker.client("")
    client.on_connect = on_connect
    client.on_message = on_message
    try:
        client.connect(broker.host, broker.port, keepalive=30)
    except OSError as err:
        raise TelemetryError(
            f"cannot reach {broker.describe()}: {err}", "check the host, the port and that the broker runs"
        ) from err
    client.loop_start()
    end = time.monotonic() + duration if duration else math.inf
    try:
        if as_json or not console.is_terminal:
            while time.monotonic() < end and not refused:
                time.sleep(0.1)
        else:
            with Live(view, console=console, refresh_per_second=2):
                while time.monotonic() < end and not refused:
                    time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        client.disconnect()
        client.loop_stop()
    if refused:
        raise TelemetryError(
            f"{broker.describe()} refused the connection: {refused[0]}", "check the user and password"
        )
    if not as_json and not console.is_terminal:
        for line in view.lines():
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    err_console.print(f"[dim]{view.messages} messages from {len(view.devices)} device(s)[/]")
