"""``edgekit serve BUNDLE``: the bundle's model over the Open Inference Protocol (HTTP/REST and gRPC)."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from edgekit.commands.common import (
    FleetOpt,
    MqttCaOpt,
    MqttCertOpt,
    MqttKeyOpt,
    MqttProtocolOpt,
    SpoolOpt,
    TelemetryIntervalOpt,
    err_console,
)
from edgekit.commands.run import RECORDS_QUEUE, BudgetOpt, DeviceOpt, _load
from edgekit.core.redact import redact_source
from edgekit.errors import EdgekitError

if TYPE_CHECKING:
    from edgekit.model import Model
    from edgekit.pipeline.records import FrameResult
    from edgekit.serve import Running

TOKEN_ENV = "EDGEKIT_SERVE_TOKEN"


def register(app: typer.Typer) -> None:
    app.command("serve")(serve_command)


def serve_command(
    bundle: Annotated[Path, typer.Argument(help="A bundle directory or .tar.gz (edgekit build).")],
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (anything but loopback needs a token).")
    ] = "127.0.0.1",
    http_port: Annotated[int, typer.Option("--http-port", help="HTTP/REST port (0: any free one).")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", help="gRPC port (0: any free one).")] = 8001,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help=f"Require this token (Authorization: Bearer; gRPC metadata authorization); or set {TOKEN_ENV}. "
            "Needed off loopback.",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host", help="Also answer HTTP requests for this host name (the Host header)."
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option("--tls-cert", help="Serve HTTPS and gRPC over TLS with this certificate (PEM)."),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option("--tls-key", help="The certificate's private key (PEM).")
    ] = None,
    device: DeviceOpt = "auto",
    key: Annotated[
        list[Path] | None,
        typer.Option(
            "--key",
            help="Trusted public key (repeat): the bundle must be signed by one of these "
            "(default: the trust store).",
        ),
    ] = None,
    allow_unsigned: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned",
            help="Serve a bundle that is unsigned or signed by a key not trusted here. Not with --key.",
        ),
    ] = False,
    queue: Annotated[
        int,
        typer.Option("--queue", min=1, help="Requests that may wait for the model; more are answered 429."),
    ] = 16,
    max_request_mb: Annotated[
        float,
        typer.Option("--max-request-mb", min=0.001, help="Largest request body or gRPC message, in MB."),
    ] = 64.0,
    deadline: Annotated[
        float,
        typer.Option(
            "--deadline", min=0.001, help="Seconds a request may wait and run before it is answered an error."
        ),
    ] = 10.0,
    max_batch: Annotated[
        str,
        typer.Option(
            "--max-batch",
            help="Most waiting requests inferred as one batch (same model name and input shape), "
            "when the artifact has a free batch dimension; off: one at a time.",
        ),
    ] = "8",  # edgekit.serve.runner.DEFAULT_MAX_BATCH, written out: the CLI imports serve lazily
    max_queue_delay_ms: Annotated[
        float,
        typer.Option(
            "--max-queue-delay-ms",
            min=0.0,
            help="How long a request may wait for others to join its batch; 0: only those already waiting.",
        ),
    ] = 0.0,
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            envvar="EDGEKIT_TRACE",
            help="Export OpenTelemetry traces of requests over OTLP, configured by OTEL_EXPORTER_OTLP_ENDPOINT, "
            "OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME; a request's traceparent (HTTP header, gRPC "
            "metadata) is its parent. Kept: every failed or late request, every one its caller sampled, "
            "each 5 s's slowest, 1% of the rest, at most 10 a second (pip install 'edgekit[tracing]'). "
            "Without an endpoint: a warning, and nothing traced.",
        ),
    ] = False,
    device_id: Annotated[
        str | None,
        typer.Option(
            "--device-id",
            help="Device id in the traces' resource (device.id) and the cameras' telemetry (MQTT "
            "client id); default: the host name.",
        ),
    ] = None,
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            "-s",
            help="A camera labelled beside the server (repeat: cam0, cam1, ...): its frames share the "
            "model and its batches with the requests.",
        ),
    ] = None,
    budget: BudgetOpt = None,
    records: Annotated[
        Path | None, typer.Option("--records", help="Write the cameras' frame records here (JSON lines).")
    ] = None,
    mqtt: Annotated[
        str | None,
        typer.Option(
            "--mqtt",
            envvar="EDGEKIT_MQTT",
            help="Report the cameras' telemetry to this broker, as edgekit run does: mqtt[s]://[user@]host[:port].",
        ),
    ] = None,
    fleet: FleetOpt = "default",
    telemetry_interval: TelemetryIntervalOpt = 5.0,
    spool: SpoolOpt = None,
    mqtt_ca: MqttCaOpt = None,
    mqtt_cert: MqttCertOpt = None,
    mqtt_key: MqttKeyOpt = None,
    mqtt_protocol: MqttProtocolOpt = "3.1.1",
) -> None:
    """Serve BUNDLE's model over the Open Inference Protocol (KServe v2): HTTP/REST and gRPC, as Triton does.

    Two model names: NAME takes the artifact's own tensors; NAME-image takes a JPEG/PNG (input
    IMAGE, BYTES) or a UINT8 HxWx3 BGR frame and answers labels or detections in frame pixels.
    With --source, cameras run beside the server on the same model: their frames and the image
    requests are inferred in the same batches, each frame within its budget.
    """
    from edgekit.core.tokens import read_token
    from edgekit.serve import Batching, Limits, ServeOptions, start
    from edgekit.serve.server import check_access

    options = ServeOptions(
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        token=read_token(token_file, TOKEN_ENV),
        allowed_hosts=tuple(allowed_host or ()),
        tls_cert=tls_cert,
        tls_key=tls_key,
        limits=Limits(queue_size=queue, max_request_bytes=int(max_request_mb * 1e6), deadline_s=deadline),
        batching=Batching(_max_batch(max_batch), max_queue_delay_ms),
    )
    check_access(options)  # before the model loads: a refusal costs nothing
    if mqtt is not None and not source:
        raise EdgekitError("--mqtt reports the cameras' telemetry, and there are none", "add --source URI")
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with _load(bundle, device, key, allow_unsigned) as model:
            err_console.print(f"loaded {model!r}; starting the listeners", highlight=False, markup=False)
            if trace:
                from edgekit.telemetry import trace_requests

                options = dataclasses.replace(options, tracer=trace_requests(model, device_id=device_id))
            running = start(model, options)
            cameras = None
            try:
                if source:
                    telemetry = None
                    if mqtt is not None:
                        telemetry = {
                            "mqtt": mqtt,
                            "device_id": device_id,
                            "fleet": fleet,
                            "interval_s": telemetry_interval,
                            "spool": spool,
                            "ca_file": mqtt_ca,
                            "cert_file": mqtt_cert,
                            "key_file": mqtt_key,
                            "protocol": mqtt_protocol,
                        }
                    cameras = _Cameras(model, running, source, budget, records, telemetry)
                scheme = "https" if tls_cert else "http"
                err_console.print(
                    f"ready: {model.name} {model.manifest.model.version} ({model.task}) on "
                    f"{scheme}://{_url_host(host)}:{running.http_port}/v2 and grpc {_url_host(host)}:{running.grpc_port}"
                    f"; models {', '.join(running.service.endpoints)}"
                    + ("; token required" if options.token else ""),
                    highlight=False,
                    markup=False,
                    soft_wrap=True,
                )
                while not stop.wait(0.5):
                    pass
                err_console.print("stopping", highlight=False)
            finally:
                if cameras is not None:  # before the server: its frames need the model until they end
                    cameras.stop()
                running.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class _Cameras:
    """The cameras' pipeline on the server's model worker, run on its own thread."""

    def __init__(
        self,
        model: Model,
        running: Running,
        sources: list[str],
        budget: float | None,
        records: Path | None,
        telemetry: dict[str, Any] | None,
    ) -> None:
        from edgekit.pipeline import Pipeline
        from edgekit.pipeline.sinks import FunctionSink

        self.pipeline = Pipeline(model, sources=sources, budget_ms=budget, shared=running.frames())
        if telemetry is not None:
            from edgekit.telemetry import report

            try:
                report(self.pipeline, **telemetry)  # stops with the pipeline
            except BaseException:
                self.pipeline.close()  # a camera must not stay claimed
                raise
        if records is not None:
            out = records.open("w", encoding="utf-8")

            def write(result: FrameResult) -> None:
                out.write(json.dumps(result.record.to_dict()) + "\n")

            self.pipeline.add_sink(FunctionSink("records", write, depth=RECORDS_QUEUE, close=out.close))
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="edgekit-serve-cameras", daemon=True)
        self._thread.start()
        err_console.print(
            f"cameras: {', '.join(f'{n} ({redact_source(s.info.uri)})' for n, s in self.pipeline.sources.items())}"
            f", {self.pipeline.budget_ms:g} ms budget, sharing the model with the requests",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )

    def _run(self) -> None:
        # The server goes on when its cameras end (a file, a camera that failed): said once, here.
        try:
            for _ in self.pipeline:
                pass
        except BaseException as err:  # noqa: BLE001 (the requests are still served)
            self.error = err
            err_console.print(f"the cameras stopped: {err}", highlight=False, markup=False)
        else:
            if self.pipeline.ended_by != "stop":
                err_console.print(f"the cameras ended: {self.pipeline.ended_by}", highlight=False)

    def stop(self) -> None:
        self.pipeline.stop()
        self._thread.join(30)
        self.pipeline.close()
        err_console.print(self.pipeline.summary().render(), highlight=False, markup=False)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _max_batch(text: str) -> int:
    """``off`` -> 1 (one at a time), a number n >= 1 -> n."""
    from edgekit.errors import EdgekitError

    if text.strip() == "off":
        return 1
    if not text.strip().isdigit() or int(text) < 1:
        raise EdgekitError(f"--max-batch takes a number >= 1 or off, got {text!r}", "e.g. --max-batch 8")
    return int(text)
