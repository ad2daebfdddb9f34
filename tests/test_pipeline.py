"""The frame pipeline end to end on the reference bundle (EfficientNet-Lite0, x86_64-cpu) and real sources."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from mjpeg_server import MjpegCamera
from skimage import data
from stand_in import STAND_IN_MS, model_ms, slower
from test_sources import write_video

import edgekit
from edgekit.errors import EdgekitError, PipelineError
from edgekit.pipeline.sinks import sink

from conftest import edgekit as run_cli

pytestmark = pytest.mark.slow

CAT_CLASSES = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat


def chelsea(size: tuple[int, int] = (640, 480)) -> np.ndarray:
    return cv2.resize(data.chelsea()[..., ::-1], size, interpolation=cv2.INTER_AREA)


@pytest.fixture(scope="module")
def model(x86_bundle: tuple[Path, dict[str, Any]]) -> Any:
    with edgekit.load(x86_bundle[0], device="x86_64-cpu") as m:
        yield m


@pytest.fixture(scope="module")
def chelsea_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two seconds of chelsea panning slowly, written with cv2.VideoWriter (MJPEG, 30 fps)."""
    base = chelsea((700, 520))
    frames = [np.ascontiguousarray(base[20:500, i : i + 640]) for i in range(0, 60)]
    return write_video(tmp_path_factory.mktemp("clip") / "chelsea.avi", frames, fps=30)


def test_every_frame_of_a_video_file_is_labelled_a_cat(model: Any, chelsea_clip: Path) -> None:
    results = list(edgekit.Pipeline(model, str(chelsea_clip)))
    assert len(results) == 60
    assert all(r.top is not None and r.top.id in CAT_CLASSES for r in results)
    recs = [r.record for r in results]
    assert [r.index for r in recs] == list(range(60))  # block (the file default): nothing dropped
    for r in recs:
        stages = r.stage_ms()
        assert all(v >= 0 for v in stages.values())
        assert r.deadline_ns == r.captured_ns + round(33.3e6)
        assert r.latency_ms >= sum(v for k, v in stages.items() if k != "sink") - 1e-6
        assert r.candidate == "onnxruntime-fp32" and r.dropped_before == 0


def test_summary_and_counters_account_for_every_frame(model: Any, chelsea_clip: Path) -> None:
    # A budget nothing meets on any machine: the stand-in adds the whole budget to every inference.
    with slower(model), edgekit.Pipeline(model, str(chelsea_clip), budget_ms=STAND_IN_MS) as p:
        summary = p.run()
    c = summary.counters
    assert summary.frames == c["frames"] == 60 == c["met"] + c["missed"]
    assert c["missed"] == 60
    d = summary.to_dict()
    assert d["result"] == "INVALID" and d["policy"] == "block" and d["ended_by"] == "source ended"
    lat = d["latency_ms"]
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"] * 1.01
    assert set(d["stages_ms"]) == {"capture_wait", "preprocess", "inference", "postprocess", "sink"}
    text = summary.render()
    for needle in ("99.90 percentile", "QPS", "Deadline misses  : 60", "inference"):
        assert needle in text


def test_callbacks_see_every_frame_and_their_time_is_the_sink_stage(model: Any, chelsea_clip: Path) -> None:
    seen = []

    def slow_sink(result: edgekit.FrameResult) -> None:
        seen.append(result.top)
        time.sleep(0.02)

    records: list[edgekit.FrameRecord] = []
    with edgekit.Pipeline(model, str(chelsea_clip), frames=10, on_result=slow_sink) as p:
        p.add_sink(sink("records", lambda r: records.append(r.record)))
        summary = p.run()
    assert len(seen) == 10 == len(records) and summary.ended_by == "frames"
    assert all(r.sink_ms >= 15 for r in records)  # a lower bound: the sink slept 20 ms
    assert summary.stages["sink"]["p50"] >= 15


def test_an_image_folder_with_grey_and_differently_sized_images(model: Any, tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "1-chelsea.jpg"), chelsea())
    cv2.imwrite(str(tmp_path / "2-coffee.png"), data.coffee()[..., ::-1])  # 600x400: a new size
    cv2.imwrite(str(tmp_path / "3-camera.png"), data.camera())  # 8-bit grayscale
    with edgekit.Pipeline(model, str(tmp_path), top=3) as p:
        results = list(p)
    assert len(results) == 3
    assert results[0].top is not None and results[0].top.id in CAT_CLASSES
    assert results[1].top is not None and results[1].top.name in {"espresso", "cup", "coffee mug"}
    assert p.counters.converted == 1 and p.counters.size_changes == 2


def test_breaking_out_of_the_loop_stops_the_capture_thread(model: Any) -> None:
    for result in edgekit.Pipeline(model, "synthetic:320x240@60"):
        assert result.frame.shape == (240, 320, 3)
        break
    deadline = time.monotonic() + 5
    while (
        any(t.name.startswith("edgekit-capture") for t in threading.enumerate())
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not any(t.name.startswith("edgekit-capture") for t in threading.enumerate())


def test_a_live_source_drops_stale_frames_instead_of_queueing(model: Any) -> None:
    # A live camera four times faster than the model, on any machine: the stand-in makes each
    # inference take at least STAND_IN_MS, and the source's rate comes from the model's time
    # measured here.  Most frames must be dropped, none queued.
    with slower(model):
        per_frame_ms = model_ms(model, np.zeros((240, 320, 3), np.uint8))
        fps = 4e3 / per_frame_ms
        with edgekit.Pipeline(model, f"synthetic:320x240@{fps:.3f}", frames=30) as p:
            results = list(p)
    assert p.policy is edgekit.Policy.DROP_OLDEST
    attributed = sum(r.record.dropped_before for r in results)
    # Every drop is counted, and each is reported on the frame that follows it.
    assert p.counters.dropped >= attributed > 0
    assert [r.record.index for r in results][-1] == len(results) - 1 + attributed
    # The frame each loop takes is the newest: it waited about one source interval (a quarter of
    # an inference), never a backlog of inference times (queued, the median frame would wait
    # about ten of them).
    waits = sorted(r.record.capture_wait_ms for r in results)
    inference = sorted(r.record.inference_ms for r in results)
    assert waits[len(waits) // 2] < inference[len(inference) // 2]


def test_the_network_camera_goes_away_mid_stream_and_the_pipeline_keeps_going(model: Any) -> None:
    camera = MjpegCamera([chelsea((320, 240))], fps=30)
    camera.start()
    try:
        with edgekit.Pipeline(model, camera.url, frames=60) as p:
            for result in p:
                assert result.top is not None and result.top.id in CAT_CLASSES
                if p.counters.frames == 15:  # frame 16 is being handed over: take the camera away
                    camera.stop()
                    threading.Timer(1.0, camera.start).start()
        assert p.counters.frames == 60
        assert p.counters.source_outages >= 1 and p.counters.source_reopens >= 1
        assert p.summary().counters["source_reopens"] >= 1
    finally:
        camera.stop()


def test_degrade_switches_to_a_faster_artifact_and_says_so(
    x86_bundle: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    # A device whose first choice is the TVM library, made slow on any machine: the stand-in adds
    # STAND_IN_MS to each of its inferences, and the budget is STAND_IN_MS, so no frame on it fits.
    # Degrade must measure the alternatives (as they are) and move to a faster one.
    (tmp_path / "slow-first.toml").write_text(
        'name = "slow-first"\ndescription = "TVM first"\narch = "x86_64"\ncpu = "x86-64-v3"\nbudget_ms = 33.3\n'
        'camera = "0"\n[tvm_target]\nkind = "llvm"\nmtriple = "x86_64-linux-gnu"\nmcpu = "haswell"\n'
        '[[candidates]]\nbackend = "tvm"\nprecision = "fp32"\noptions = { device = "cpu" }\n'
        '[[candidates]]\nbackend = "onnxruntime"\nprecision = "fp32"\n'
        'options = { providers = ["CPUExecutionProvider"] }\n'
    )
    monkeypatch.setenv("EDGEKIT_DEVICES_PATH", str(tmp_path))
    with edgekit.load(x86_bundle[0], device="slow-first") as slow:
        assert slow.candidate == "tvm-fp32"
        with (
            slower(slow),
            caplog.at_level(logging.WARNING),
            edgekit.Pipeline(
                slow,
                "synthetic:320x240@30",
                policy="degrade",
                budget_ms=STAND_IN_MS,
                degrade_after=5,
                frames=80,
            ) as p,
        ):
            chain = p.degrade_chain
            results = list(p)
    assert chain[0][0] == "tvm-fp32" and len(chain) >= 2 and chain[1][1] < chain[0][1]
    assert p.counters.degrade_switches >= 1
    names = [name for name, _ in chain]
    levels = [names.index(r.record.candidate) for r in results]
    # It starts on the primary, only ever steps down the chain here (the primary cannot fit its
    # budget, so it is never retried), and ends on a faster artifact.
    assert levels[0] == 0 and levels == sorted(levels) and levels[-1] >= 1
    assert p.counters.degrade_switches == len(set(levels)) - 1
    assert any(f"degrade: switched tvm-fp32 -> {names[1]}" in m for m in caplog.messages)
    assert p.summary().candidates_used.keys() == {names[i] for i in set(levels)}


def test_pipeline_arguments_are_checked(model: Any) -> None:
    for kwargs, needle in (
        ({"budget_ms": 0}, "budget"),
        ({"frames": 0}, "frames"),
        ({"duration_s": -1}, "duration"),
        ({"policy": "newest"}, "policy"),
    ):
        with pytest.raises(PipelineError, match=needle):
            edgekit.Pipeline(model, "synthetic:", **kwargs)
    p = edgekit.Pipeline(model, "synthetic:64x48@0", frames=1)
    list(p)
    with pytest.raises(PipelineError, match="runs once"):
        list(p)


def test_duration_ends_a_run_even_when_no_frame_comes(model: Any) -> None:
    camera = MjpegCamera([chelsea((64, 48))], fps=30)
    camera.start()
    p = edgekit.Pipeline(model, camera.url, duration_s=2.0)
    camera.stop()  # opened, then gone for good: the source keeps reconnecting
    start = time.monotonic()
    summary = p.run()
    p.close()
    assert summary.ended_by == "duration" and time.monotonic() - start < 15


def test_a_bundle_with_a_missing_artifact_is_refused_at_load(
    x86_bundle: tuple[Path, dict[str, Any]], tmp_path: Path, cache_env: dict[str, str]
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(x86_bundle[0], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    onnx = next(a["path"] for a in manifest["artifacts"] if a["name"] == "onnxruntime-fp32")
    (broken / onnx).unlink()
    with pytest.raises(EdgekitError) as err:
        edgekit.load(broken, device="x86_64-cpu")
    assert onnx in err.value.message
    r = run_cli(cache_env, "run", str(broken), "--source", "synthetic:", "--frames", "5")
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr and onnx in r.stderr


def test_cli_run_reads_the_broker_from_edgekit_mqtt_as_the_agent_does(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    env = {**cache_env, "EDGEKIT_MQTT": "http://not-a-broker"}
    r = run_cli(
        env, "run", str(x86_bundle[0]), "--source", "synthetic:", "--frames", "3", "--device", "x86_64-cpu"
    )
    assert r.returncode == 2 and "not an MQTT broker URL: 'http://not-a-broker'" in r.stderr, r.stderr[-2000:]


def test_cli_run_on_a_file_prints_json_and_writes_records(
    x86_bundle: tuple[Path, dict[str, Any]], chelsea_clip: Path, tmp_path: Path, cache_env: dict[str, str]
) -> None:
    records = tmp_path / "frames.jsonl"
    r = run_cli(
        cache_env, "run", str(x86_bundle[0]), "--source", str(chelsea_clip), "--frames", "20",
        "--json", "--records", str(records), "--device", "x86_64-cpu",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert summary["frames"] == 20 and summary["ended_by"] == "frames" and summary["policy"] == "block"
    assert summary["counters"]["met"] + summary["counters"]["missed"] == 20
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 20 and {"deadline_ns", "inference_ms", "met", "dropped_before"} <= lines[0].keys()


def test_cli_run_plain_lines_and_the_loadgen_summary(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    r = run_cli(
        cache_env, "run", str(x86_bundle[0]), "--source", "synthetic:320x240@30", "--duration", "2.5",
        "--device", "x86_64-cpu",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert "frame=" in r.stdout and "p99=" in r.stdout  # not a terminal: plain lines
    for needle in (
        "edgekit pipeline summary",
        "Result",
        "QPS",
        "50.00 percentile",
        "99.90 percentile",
        "capture_wait",
    ):
        assert needle in r.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--source", "/dev/video63"], "cannot open camera"),
        (["--source", "nothing-here.mp4"], "is not a camera"),
        (["--source", "v4l2src ! appsink"], "without GStreamer"),
        (["--source", "synthetic:", "--policy", "sometimes"], "unknown overload policy"),
    ],
)
def test_cli_run_bad_sources_are_errors_not_hangs(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], args: list[str], needle: str
) -> None:
    start = time.monotonic()
    r = run_cli(cache_env, "run", str(x86_bundle[0]), *args, "--frames", "3")
    assert r.returncode == 2 and needle in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - start < 120


def test_demo_builds_the_reference_bundle_and_labels_the_clip(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str]
) -> None:
    # x86_bundle filled the cache: the demo's build reuses those steps.
    env = cache_env | {"EDGEKIT_DEVICES_PATH": os.environ.get("EDGEKIT_DEVICES_PATH", "")}
    r = run_cli(env, "demo", "--frames", "150", "--json", "--device", "x86_64-cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["frames"] == 150 and Path(out["bundle"]).is_dir() and Path(out["clip"]).is_file()
    assert out["seen"]["chelsea"]["label"] in {
        "tabby",
        "tiger cat",
        "Egyptian cat",
        "Persian cat",
        "Siamese cat",
    }
    assert out["seen"]["coffee"] is not None
    # A second run reuses the bundle and the clip.
    again = run_cli(env, "demo", "--frames", "5", "--json", "--device", "x86_64-cpu")
    assert again.returncode == 0 and json.loads(again.stdout)["bundle"] == out["bundle"]
