"""Cameras beside ``edgekit serve``: a ``Pipeline`` and the server share one batcher on one session.

The model is tests/tiny_model.py's classifier with a free batch dimension (as in
test_serve_batching).  "The model is busy" is a gate on its batch-of-one session that the test
holds shut (``Gate``): frames and requests pile up because the test holds the worker, never
because this machine is slow.  The cameras are ``synthetic:`` sources (a generated pattern, paced).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td
from test_serve_batching import NAME, Gate, frame, inputs, picture, serve, tensor, wait_for_depth

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.errors import PipelineError
from edgekit.pipeline.records import FrameResult
from edgekit.pipeline.shared import SharedFrame

grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
from tritonclient.utils import InferenceServerException  # noqa: E402

CAMERA = "synthetic:64x48@30"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    keys = generate_keypair(tmp_path_factory.mktemp("keys") / "signer")
    out = tmp_path_factory.mktemp("cls") / "tiny-batch"
    return td.classifier_bundle(out, keys[0], free_batch=True), keys[1]


@pytest.fixture
def model(bundle: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    with edgekit.load(bundle[0], device="x86_64-cpu", trusted_keys=[bundle[1]], measure=False) as m:
        yield m


def run_pipeline(pipeline: edgekit.Pipeline) -> tuple[threading.Thread, list[FrameResult]]:
    results: list[FrameResult] = []
    thread = threading.Thread(target=lambda: results.extend(pipeline), daemon=True)
    thread.start()
    return thread, results


def same_labels(model: edgekit.Model, result: FrameResult) -> None:
    want = model.classify(result.frame)
    assert [lb.name for lb in result.labels] == [lb.name for lb in want]
    np.testing.assert_allclose([lb.score for lb in result.labels], [lb.score for lb in want], rtol=1e-5)


def test_a_camera_frame_and_a_picture_are_one_inference_with_their_own_labels(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8)
    pipeline = edgekit.Pipeline(model, sources=[CAMERA], frames=3, shared=running.frames())
    try:
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)  # the worker holds this request, alone
            thread, results = run_pipeline(pipeline)
            wait_for_depth(running, 1)  # the camera's first frame waits for the model ...
            data = frame(4)
            pic = pool.submit(grpc.infer, f"{NAME}-image", [picture(data)])
            wait_for_depth(running, 2)  # ... and a picture beside it
            gate.open.set()
            first.result(30)
            answer = pic.result(30)
            thread.join(30)
        assert not thread.is_alive() and len(results) == 3
        runner = running.service.runner
        # The held request; the frame and the picture as one; the camera's next two frames.
        assert runner.shared >= 1 and runner.frames == 3 and runner.requests == 2
        assert results[0].record.batch == 2 and results[0].record.camera == "cam0"
        scrape = running.service.metrics.render()
        assert "edgekit_serve_camera_frames_total 3\n" in scrape
        assert f"edgekit_serve_shared_inferences_total {runner.shared}\n" in scrape
        # The same labels as in-process, for the frames and for the picture.
        for result in results:
            same_labels(model, result)
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        assert decoded is not None
        want = model.classify(decoded)
        assert [n.decode() for n in answer.as_numpy("LABEL_NAMES")] == [lb.name for lb in want]
        # Frames are not requests: no client-facing series for them.
        assert "-frames" not in scrape
    finally:
        gate.open.set()
        pipeline.close()
        running.stop()


def test_a_late_request_is_not_computed_and_a_late_frame_is_labelled_and_missed(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8, deadline_s=0.2)
    pipeline = edgekit.Pipeline(model, sources=[CAMERA], frames=1, budget_ms=50, shared=running.frames())
    try:
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            thread, results = run_pipeline(pipeline)
            wait_for_depth(running, 1)
            late = pool.submit(grpc.infer, f"{NAME}-image", [picture(frame(2))])
            wait_for_depth(running, 2)
            threading.Event().wait(0.3)  # both past their deadlines while the worker is held
            gate.open.set()
            first.result(30)
            with pytest.raises(InferenceServerException, match="past its deadline: not computed") as err:
                late.result(30)
            assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
            thread.join(30)
        assert len(results) == 1 and not results[0].record.met  # late, labelled, counted missed
        same_labels(model, results[0])
        runner = running.service.runner
        assert runner.frames == 1 and runner.requests == 1 and runner.shared == 0
        assert pipeline.summary().counters["missed"] == 1
    finally:
        gate.open.set()
        pipeline.close()
        running.stop()


def test_the_queue_stays_bounded_requests_get_busy_and_frames_drop(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8, queue_size=2)
    pipeline = edgekit.Pipeline(model, sources=[CAMERA, CAMERA], shared=running.frames())
    try:
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            waiting = [pool.submit(grpc.infer, NAME, [tensor(inputs(s))]) for s in (1, 2)]
            thread, results = run_pipeline(pipeline)
            # The requests' room is full; the frames have their own, so the cameras still get in.
            for _ in range(3000):
                if running.service.queue.depth >= 3:
                    break
                threading.Event().wait(0.01)
            for s in range(10):
                with pytest.raises(InferenceServerException, match="busy") as err:
                    grpc.infer(NAME, [tensor(inputs(s))])
                assert err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            # Never more than the requests' room and the frames' room (one frame per camera in flight).
            assert 3 <= running.service.queue.depth <= 2 + 2
            # The frames are still in the frames' room: more are refused, not queued.
            lane = running.frames()
            extra = np.zeros((1, 3, 32, 32), np.float32)
            refused = lane.submit_frames([SharedFrame("x", extra, 0.0)] * 2)
            assert refused.count(None) >= 1 and running.service.queue.depth <= 4
            for f in refused:
                if f is not None:
                    f.cancel()
            # While the model is held, the cameras' slots drop their stale frames (the usual way).
            group = pipeline._group
            assert group is not None
            for _ in range(3000):
                if group.dropped:
                    break
                threading.Event().wait(0.01)
            gate.open.set()
            for f in (first, *waiting):
                f.result(30)
            pipeline.stop()
            thread.join(30)
        assert not thread.is_alive() and results
        summary = pipeline.summary()
        dropped = summary.counters["dropped"]
        assert dropped > 0  # counted by the pipeline, per camera
        assert sum(c["dropped"] for c in summary.cameras.values()) == dropped
        assert running.service.metrics.requests()[(NAME, "grpc", "busy")] == 10
    finally:
        gate.open.set()
        pipeline.close()
        running.stop()


def test_a_shared_worker_takes_only_its_own_model(model: edgekit.Model, bundle: tuple[Path, Path]) -> None:
    running = serve(model)
    try:
        with (
            edgekit.load(bundle[0], device="x86_64-cpu", trusted_keys=[bundle[1]], measure=False) as other,
            pytest.raises(PipelineError, match="another model"),
        ):
            edgekit.Pipeline(other, sources=[CAMERA], shared=running.frames())
        with pytest.raises(PipelineError, match="degrade"):
            edgekit.Pipeline(model, sources=[CAMERA], policy="degrade", shared=running.frames())
    finally:
        running.stop()


def test_the_command_runs_cameras_beside_the_server(bundle: tuple[Path, Path], tmp_path: Path) -> None:
    import json
    import urllib.request

    from served import serving

    records = tmp_path / "records.jsonl"
    args = ("--key", str(bundle[1]), "--source", CAMERA, "--source", CAMERA, "--records", str(records))
    with serving(bundle[0], *args) as served:
        assert any("cameras: cam0 (synthetic:64x48@30), cam1" in line for line in served.stderr)
        got = grpcclient.InferenceServerClient(served.grpc).infer(f"{NAME}-image", [picture(frame(1))])
        assert got.as_numpy("LABEL_NAMES").shape == (5,)
        for _ in range(3000):  # the cameras' frames go through the server's model
            scrape = urllib.request.urlopen(f"http://{served.http}/metrics", timeout=30).read().decode()
            if "edgekit_serve_camera_frames_total 0\n" not in scrape:
                break
            threading.Event().wait(0.01)
        assert "edgekit_serve_camera_frames_total 0\n" not in scrape
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert rows and {r["camera"] for r in rows} <= {"cam0", "cam1"} and all(r["labels"] for r in rows)
    assert any("Camera cam0" in line for line in served.stderr)  # the cameras' summary, at the end


def test_the_cameras_report_telemetry_as_edgekit_run_does(bundle: tuple[Path, Path], broker: Any) -> None:
    from served import serving
    from test_telemetry import Subscriber

    sub = Subscriber(broker.port, topic="edgekit/v1/default/served-cams/#")
    try:
        url = f"mqtt://127.0.0.1:{broker.port}"
        args = ("--key", str(bundle[1]), "--source", CAMERA, "--mqtt", url, "--telemetry-interval", "0.2")
        with serving(bundle[0], *args, "--device-id", "served-cams"):

            def counted() -> bool:
                return any(
                    m["window"]["frames"] > 0 and "cam0" in m["window"].get("cameras", {})
                    for m in sub.of("telemetry")
                )

            assert sub.wait_for(counted, 60)
    finally:
        sub.close()


def test_mqtt_without_a_camera_is_refused_before_the_model_loads(bundle: tuple[Path, Path]) -> None:
    import subprocess

    from conftest import EDGEKIT, ROOT

    r = subprocess.run(
        [*EDGEKIT, "serve", str(bundle[0]), "--key", str(bundle[1]), "--mqtt", "mqtt://127.0.0.1:1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode != 0 and "--mqtt reports the cameras' telemetry" in r.stderr


def test_a_preprocessing_buffer_is_never_shared_between_threads(model: edgekit.Model) -> None:
    # A preprocessor writes every frame into one buffer.  The server's worker and a camera loop
    # once shared the model's: a picture's tensor was overwritten by a camera frame's while it
    # waited to be batched (seen as other labels for the picture, under load).
    mine = cv2.imdecode(np.frombuffer(frame(3), np.uint8), cv2.IMREAD_COLOR)
    theirs = cv2.imdecode(np.frombuffer(frame(6), np.uint8), cv2.IMREAD_COLOR)
    assert mine is not None and theirs is not None
    x = model.preprocessor()(mine)
    want = x.copy()
    other = threading.Thread(target=lambda: model.preprocessor()(theirs))
    other.start()
    other.join()
    np.testing.assert_array_equal(x, want)
    # A pipeline made on this thread and run on its own prepares frames in buffers of its own.
    with edgekit.Pipeline(model, sources=[CAMERA], frames=3) as pipeline:
        thread, results = run_pipeline(pipeline)
        thread.join(30)
    assert len(results) == 3
    np.testing.assert_array_equal(x, want)
    assert model.preprocessor() is model.preprocessor()  # one thread's is still cached


def test_while_cameras_share_the_model_no_batch_outgrows_their_budget(model: edgekit.Model) -> None:
    # A stand-in latency: k rows take k x 10 ms, whatever this machine's speed.  With a 50 ms
    # frame budget two batches of 2 rows fit (40 ms) and of 3 do not (60 ms): a frame that
    # arrives as a batch starts must wait for it and then its own.
    rows_run: list[int] = []

    def slowed(run: Any, rows: int) -> Any:
        def call(*arrays: Any) -> Any:
            rows_run.append(rows)
            time.sleep(0.01 * rows)
            return run(*arrays)

        return call

    batched = model.session.batched

    def slow_batched(n: int) -> Any:
        session = batched(n)
        session.run = slowed(session.run, n)  # type: ignore[method-assign]
        return session

    model.session.batched = slow_batched  # type: ignore[method-assign]
    gate = Gate(slowed(model.session.run, 1))
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8, queue_size=16)
    pipeline = edgekit.Pipeline(model, sources=[CAMERA], frames=2, budget_ms=50, shared=running.frames())
    try:
        rows_run.clear()  # the warm runs at start: one per batch size
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(8) as pool:
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            thread, results = run_pipeline(pipeline)
            wait_for_depth(running, 1)  # a camera frame waits ...
            pics = [pool.submit(grpc.infer, f"{NAME}-image", [picture(frame(s))]) for s in range(6)]
            wait_for_depth(running, 7)  # ... and six pictures
            gate.open.set()
            first.result(30)
            for pic in pics:
                pic.result(30)
            thread.join(30)
        assert not thread.is_alive() and len(results) == 2
        assert max(rows_run) == 2, rows_run  # batched, but never past what the budget allows
        assert sum(rows_run) == 1 + 6 + 2  # the held request, the pictures, the two frames
    finally:
        gate.open.set()
        pipeline.close()
        running.stop()
