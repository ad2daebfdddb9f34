"""``edgekit run BUNDLE --source SRC``: the pipeline from the command line.

``--config run.toml`` reads the cameras and settings from a run file (``edgekit.commands.run_config``,
which documents its keys); the options given on the command line win over it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.live import Live

from edgekit.commands.common import (
    FleetOpt,
    JsonOpt,
    MqttCaOpt,
    MqttCertOpt,
    MqttKeyOpt,
    MqttProtocolOpt,
    SpoolOpt,
    TelemetryIntervalOpt,
    console,
    err_console,
    print_json,
)
from edgekit.commands.run_config import RunConfig, load_run_config
from edgekit.device.pacing import WARM_MAX_DUTY, WARM_MAX_PASSES
from edgekit.errors import PipelineError

if TYPE_CHECKING:
    from edgekit.events.event import Event
    from edgekit.model import Model
    from edgekit.pipeline import Camera, FrameResult, Pipeline, Seen, Summary

PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help="drop-oldest (default for cameras/streams), block (default for files), or degrade.",
    ),
]
BudgetOpt = Annotated[
    float | None, typer.Option("--budget", help="Frame budget in ms (default: the bundle's device budget).")
]
FramesOpt = Annotated[int | None, typer.Option("--frames", help="Stop after N frames.")]
DurationOpt = Annotated[float | None, typer.Option("--duration", help="Stop after S seconds.")]
DeviceOpt = Annotated[
    str, typer.Option("--device", "-d", help="Device profile, or auto to detect this host.")
]


#: Each key of a run file and the run_command parameter it sets (the rest have the same name).
_PARAM_OF = {"sources": "source", "budget_ms": "budget", "duration_s": "duration"}

RUN_FILE_HELP = (
    "Read the cameras and settings from this TOML run file. Keys (all optional): sources "
    '(a list, ["0", "rtsp://..."] -> cam0, cam1, ..., or a \\[sources] table of name = source), '
    "budget_ms, policy, fps, realtime, batch, warm, duration_s, frames, top, and a detector's "
    "zones and lines ([zones.NAME], [lines.NAME], or [cameras.CAM.zones.NAME] per camera), "
    "count_interval_s, proof_dir, clips; e.g. "
    'sources = ["0", "/dev/video2"] and budget_ms = 33 on two lines. Options given on the command '
    "line win; --source replaces the file's sources."
)


#: Frames the records file's writer may fall behind by before rows are dropped (and counted): each
#: holds its frame's image until written, so a few dozen, not thousands.
RECORDS_QUEUE = 64


def register(app: typer.Typer) -> None:
    app.command("run")(run_command)


def _quiet_opencv() -> None:
    # OpenCV and its FFmpeg print their own warnings (a camera that is not there, a stream
    # that dropped) on stderr; edgekit says the same thing once, with a hint.  --debug keeps them.
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")  # AV_LOG_QUIET, read when FFmpeg starts
    import cv2

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)


def drive(pipeline: Pipeline, *, as_json: bool, records: Path | None = None, sink: Any = None) -> Summary:
    """Run ``pipeline`` with the live view (terminal), plain lines (pipe) or nothing (``--json``)."""
    from edgekit.commands.live import LiveView
    from edgekit.pipeline.sinks import FunctionSink

    view = LiveView(pipeline)
    if records is not None:
        out = records.open("w", encoding="utf-8")

        def write(result: FrameResult) -> None:
            out.write(json.dumps(result.record.to_dict()) + "\n")

        # Queued: the file's writes (and a slow disk) stay off the frame loop; a full queue drops rows,
        # counted in the summary's sink_dropped.
        pipeline.add_sink(FunctionSink("records", write, depth=RECORDS_QUEUE, close=out.close))

    def each(result: FrameResult) -> None:
        view.update(result)
        if sink is not None:
            sink(result)

    try:
        if as_json:
            for result in pipeline:
                each(result)
        elif console.is_terminal:
            with Live(view, console=console, refresh_per_second=2, transient=False):
                for result in pipeline:
                    each(result)
        else:
            console.print(view.headline(), highlight=False)
            for result in pipeline:
                each(result)
                view.plain_line(console)
    except KeyboardInterrupt:
        pipeline.ended_by = "interrupt"
    finally:
        pipeline.sinks.close()  # the records file written out and closed before the summary
    return pipeline.summary()


def _load(
    bundle: Path, device: str, keys: list[Path] | None, allow_unsigned: bool, measure: bool | None = None
) -> Model:
    import edgekit

    if allow_unsigned:
        from edgekit.bundle.trust import UNSIGNED_RISK

        err_console.print(f"[bold yellow]warning:[/] {UNSIGNED_RISK}", highlight=False)

    def progress(line: str) -> None:
        # stderr, so that --json's stdout stays one document; markup off: keys hold brackets.
        err_console.print(line, highlight=False, markup=False)

    return edgekit.load(
        bundle,
        device=device,
        trusted_keys=keys,
        allow_unsigned=allow_unsigned,
        measure=measure,
        progress=progress,
    )


def run_command(
    ctx: typer.Context,
    bundle: Annotated[Path, typer.Argument(help="A bundle directory or .tar.gz (edgekit build).")],
    source: Annotated[
        list[str] | None,
        typer.Option(
            "--source",
            "-s",
            # Not typer's envvar: it would split a list option's value on spaces, and a GStreamer
            # pipeline has them.  $EDGEKIT_SOURCE (a source with a password: keep it off the
            # command line) is read whole when no --source is given.
            help="0 or /dev/video0 (camera), a video file, an image folder, an http(s)/rtsp URL, "
            "a GStreamer pipeline, or synthetic:640x480@30. Repeat it for many cameras: one model, "
            "records and summary per camera (cam0, cam1, ...). Replaces a run file's sources. "
            "Default: the run file's, else $EDGEKIT_SOURCE, else 0.",
            show_default=False,
        ),
    ] = None,
    budget: BudgetOpt = None,
    policy: PolicyOpt = None,
    duration: DurationOpt = None,
    frames: FramesOpt = None,
    realtime: Annotated[
        bool,
        typer.Option(
            "--realtime/--no-realtime", help="Replay a file or folder at its frame rate, like a camera."
        ),
    ] = False,
    fps: Annotated[
        float | None, typer.Option("--fps", help="Frame rate of a folder (or override a file's).")
    ] = None,
    top: Annotated[int, typer.Option("--top", help="Labels per frame (a classifier's).")] = 5,
    device: DeviceOpt = "auto",
    key: Annotated[
        list[Path] | None,
        typer.Option(
            "--key",
            help="Trusted public key (repeat): the bundle must be signed by one of these "
            "(default: the trust store, $EDGEKIT_TRUST or ~/.config/edgekit/trusted-keys and keys).",
        ),
    ] = None,
    allow_unsigned: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned",
            help="Run a bundle that is unsigned or signed by a key not trusted here (its native code "
            "runs unchecked). Not with --key.",
        ),
    ] = False,
    require_signature: Annotated[
        bool, typer.Option(hidden=True, help="Kept for old scripts: a signature is always required.")
    ] = True,
    records: Annotated[
        Path | None,
        typer.Option(
            "--records",
            help="Write every frame's record to this file (JSON lines): its timings and its labels "
            "(id, name, score) or detections (class_id, name, score, box in frame pixels).",
        ),
    ] = None,
    mqtt: Annotated[
        str | None,
        typer.Option(
            "--mqtt",
            envvar="EDGEKIT_MQTT",
            help="Report telemetry to this broker: mqtt[s]://[user@]host[:port] (as `edgekit agent run`).",
        ),
    ] = None,
    fleet: FleetOpt = "default",
    device_id: Annotated[
        str | None, typer.Option("--device-id", help="Device id (MQTT client id); default: the host name.")
    ] = None,
    telemetry_interval: TelemetryIntervalOpt = 5.0,
    spool: SpoolOpt = None,
    mqtt_ca: MqttCaOpt = None,
    mqtt_cert: MqttCertOpt = None,
    mqtt_key: MqttKeyOpt = None,
    mqtt_protocol: MqttProtocolOpt = "3.1.1",
    telemetry_format: Annotated[
        str,
        typer.Option("--telemetry-format", help="json (edgekit/v1/... topics) or sparkplug (Sparkplug B)."),
    ] = "json",
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            envvar="EDGEKIT_TRACE",
            help="Export OpenTelemetry traces of the slow frames over OTLP, configured by OTEL_EXPORTER_OTLP_"
            "ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf or grpc), OTEL_SERVICE_NAME: every frame "
            "over its budget, each window's slowest, 1% of the rest (pip install 'edgekit[tracing]'). "
            "Without an endpoint: a warning, and nothing traced.",
        ),
    ] = False,
    preview: Annotated[
        str | None,
        typer.Option(
            "--preview",
            help="Serve the frames with what the model saw (boxes drawn) at HOST:PORT for a browser; "
            ":8080 is this machine only (the preview has no login), :0 picks a free port.",
        ),
    ] = None,
    measure: Annotated[
        bool | None,
        typer.Option(
            "--measure/--no-measure",
            help="With no selection in the bundle for this host, measure its candidates at the camera "
            "rate on the first load here (a few seconds; kept for later runs) and run the fastest. "
            "--no-measure: the device profile's order. Default: measure, unless EDGEKIT_MEASURE=0.",
        ),
    ] = None,
    warm: Annotated[
        str,
        typer.Option(
            "--warm",
            help="Keep the model warm between a camera's frames: untimed passes just before each "
            f"frame is due, as many as fit in {WARM_MAX_DUTY:.0%} of the frame period, at most "
            f"{WARM_MAX_PASSES} (auto: while one fits; on: at least one; off).",
        ),
    ] = "auto",
    batch: Annotated[
        str,
        typer.Option(
            "--batch",
            help="Infer the frames of several cameras that wait together as one batch: auto (when the "
            "model allows it, up to min(cameras, 8)), off (one frame per inference), or N (at most N).",
        ),
    ] = "auto",
    config: Annotated[Path | None, typer.Option("--config", "-c", help=RUN_FILE_HELP)] = None,
    events: Annotated[
        bool,
        typer.Option(
            "--events",
            help="Print each zone and line event as it happens (the run file's zones and lines; "
            "with --json, the events are in the document).",
        ),
    ] = False,
    proof_dir: Annotated[
        Path | None,
        typer.Option(
            "--proof-dir",
            help="Keep a JPEG snapshot (boxes drawn) and a short clip of each zone or line event "
            "in this folder (7 days, 1 GiB at most; the oldest go first).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Label frames from a source with a bundle (or find objects in them), each within the frame budget;
    end with a LoadGen-style summary and what the model saw.

    A run file (--config run.toml) keeps the cameras and settings of a run, e.g.
    sources = ["rtsp://door.local/stream", "/dev/video0"], budget_ms = 33, batch = "auto",
    one key per line (see --config for every key).
    """
    from edgekit.pipeline import Seen

    _quiet_opencv()
    for one in source or []:
        _warn_if_source_secret_on_command_line(one)
    # The command line's value where it was given there, else the run file's, else the default.
    given = _given_on_command_line(ctx)
    run_file = load_run_config(config) if config is not None else None
    opts = _merged(
        run_file,
        given,
        {
            "source": source,
            "budget": budget,
            "policy": policy,
            "fps": fps,
            "realtime": realtime,
            "batch": batch,
            "warm": warm,
            "duration": duration,
            "frames": frames,
            "top": top,
            "proof_dir": proof_dir,
        },
    )
    sources: list[str] | dict[str, str | Camera] = opts["source"] or [os.environ.get("EDGEKIT_SOURCE") or "0"]
    with (
        _load(bundle, device, key, allow_unsigned, measure) as model,
        _open_pipeline(model, sources, opts, run_file) as pipeline,
    ):
        event_log = _add_events(pipeline, run_file, opts, print_events=events and not as_json)
        tracer = None
        if trace:
            from edgekit.telemetry import trace as start_tracing

            tracer = start_tracing(pipeline, device_id=device_id)
        if mqtt is not None:
            from edgekit.telemetry import report

            report(
                pipeline,
                mqtt,
                device_id=device_id,
                fleet=fleet,
                interval_s=telemetry_interval,
                spool=spool,
                ca_file=mqtt_ca,
                cert_file=mqtt_cert,
                key_file=mqtt_key,
                protocol=mqtt_protocol,
                format=telemetry_format,
                tracer=tracer,
            )
        if preview is not None:
            from edgekit.preview import start_preview

            # It stops with the pipeline (a closer); stderr, so that --json's stdout stays one document.
            server = start_preview(pipeline, preview)
            err_console.print(f"preview: {server.url}", highlight=False)
        # Under systemd (Type=notify, WatchdogSec=) or the agent: READY=1, then WATCHDOG=1 while frames flow.
        from edgekit.pipeline.heartbeat import attach_heartbeat

        attach_heartbeat(pipeline)
        seen = Seen(model.task)
        pipeline.add_sink(seen)
        if not as_json:
            console.print(
                f"candidate {model.selection.describe()}", highlight=False, markup=False, soft_wrap=True
            )
        summary = drive(pipeline, as_json=as_json, records=records)
    extra: dict[str, Any] = {"selection": model.selection.to_dict()}
    if event_log is not None:
        extra["events"] = event_log.to_dict(with_events=events)
    _report(summary, as_json, extra, seen=seen)


def _add_events(
    pipeline: Pipeline, run_file: RunConfig | None, opts: dict[str, Any], *, print_events: bool
) -> EventLog | None:
    """The run file's zones and lines as the pipeline's events (None when it has none)."""
    regions = run_file.regions(list(pipeline.sources)) if run_file is not None else {}
    if not regions:
        if print_events:
            raise PipelineError(
                "--events, but no zones or lines to make events of",
                "give a run file (--config run.toml) with [zones.<name>] or [lines.<name>] tables",
            )
        return None
    from edgekit.events.proof import ProofConfig

    proof_dir = opts.get("proof_dir")
    proof = ProofConfig(clips=bool(opts.get("clips", True)))
    pipeline.add_events(regions, proof_dir=Path(proof_dir) if proof_dir else None, proof=proof)
    log_ = EventLog(print_events)
    pipeline.on_event(log_.add)
    return log_


class EventLog:
    """The run's events for its summary (counts, the last ones) and, with ``--events``, one line each."""

    KEEP = 200

    def __init__(self, print_each: bool) -> None:
        from collections import Counter, deque

        self.print_each = print_each
        self.counts: Counter[str] = Counter()
        self.last: deque[Event] = deque(maxlen=self.KEEP)

    def add(self, event: Event) -> None:
        self.counts[event.kind] += 1
        self.last.append(event)
        if self.print_each:
            console.print(_event_line(event), highlight=False, markup=False, soft_wrap=True)

    def to_dict(self, *, with_events: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"counts": dict(sorted(self.counts.items()))}
        if with_events:
            out["last"] = [e.to_dict() for e in self.last]
        return out


def _event_line(e: Event) -> str:
    """``12.4 s  cam0  gate  cross in  car #7`` -- one line, what a person scans for."""
    where = " ".join(p for p in (e.camera, e.zone or "") if p)
    what = e.kind + (f" {e.direction}" if e.direction else "")
    if e.dwell_s is not None:
        what += f" {e.dwell_s:.1f} s"
    who = f"{e.class_name or ''} #{e.track_id}" if e.track_id is not None else (e.class_name or "")
    if e.kind == "count" and e.counts:
        who = json.dumps(e.counts, separators=(",", ":"), sort_keys=True)
    return f"frame {e.frame_index:>6}  {where:<16} {what:<14} {who}".rstrip()


def _open_pipeline(
    model: Model,
    sources: list[str] | dict[str, str | Camera],
    opts: dict[str, Any],
    run_file: RunConfig | None,
) -> Pipeline:
    from edgekit.pipeline import Pipeline

    one_source = sources[0] if isinstance(sources, list) and len(sources) == 1 else None
    try:
        return Pipeline(
            model,
            one_source,
            sources=sources if one_source is None else None,
            budget_ms=opts["budget"],
            policy=opts["policy"],
            realtime=opts["realtime"],
            fps=opts["fps"],
            frames=opts["frames"],
            duration_s=opts["duration"],
            top=opts["top"],
            warm=opts["warm"],
            batch=opts["batch"],  # "4" from the command line: the Pipeline reads it
        )
    except PipelineError as err:
        if run_file is None:
            raise
        # The run file's types were checked as it was read; its values are the Pipeline's to judge.
        raise PipelineError(
            err.message, f"{err.hint} (on the command line, or in the run file {run_file.path})"
        ) from err


def _given_on_command_line(ctx: typer.Context) -> set[str]:
    # By the enum's name: typer carries its own copy of click, whose ParameterSource is not click's.
    given = {"COMMANDLINE", "ENVIRONMENT"}
    return {name for name in ctx.params if getattr(ctx.get_parameter_source(name), "name", None) in given}


def _merged(run_file: RunConfig | None, given: set[str], cli: dict[str, Any]) -> dict[str, Any]:
    """``cli`` with each value the command line did not give taken from the run file, where it has one."""
    if run_file is None:
        return cli
    merged = dict(cli)
    for key, value in run_file.values.items():
        param = _PARAM_OF.get(key, key)
        if param not in given:
            merged[param] = run_file.sources if key == "sources" else value
    return merged


def _warn_if_source_secret_on_command_line(source: str) -> None:
    from edgekit.core.redact import warn_secret_on_command_line

    warn_secret_on_command_line(
        source,
        "the password or token in the source",
        "pass the source in EDGEKIT_SOURCE instead",
        logger=logging.getLogger(__name__),
    )


def _report(
    summary: Summary, as_json: bool, extra: dict[str, Any] | None = None, seen: Seen | None = None
) -> None:
    # What the model saw ends both forms, after the timings.
    saw: dict[str, Any] = {}
    if seen is not None:
        if seen.task == "detection":  # which frames, and their boxes: the counts alone do not say where
            saw["last_frames"] = seen.last_frames()
        saw |= {"task": seen.task, "seen": seen.to_dict()}
    data = summary.to_dict() | (extra or {}) | saw
    if as_json:
        print_json(data)  # the document still goes out: it says what happened (frames 0, outages)
    else:
        console.print(summary.render(), highlight=False, soft_wrap=True)
        if seen is not None:
            console.print(seen.render(), highlight=False, soft_wrap=True, markup=False)
    if summary.frames == 0:
        raise PipelineError(
            f"no frame was labelled from {summary.source}", "check the source (edgekit run --source)"
        )
