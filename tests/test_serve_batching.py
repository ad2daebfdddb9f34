"""``edgekit serve``'s dynamic batching: waiting requests inferred as one batch, with the same answers.

The model here is tests/tiny_model.py's classifier exported with a free batch dimension (as
edgekit build exports ONNX), so its session can make batched twins.  "The model is busy" is a
gate on its batch-of-one session that the test holds shut (``Gate``): requests pile up because
the test holds the worker, not because this machine is slow.  The batch queue's own rules
(earliest deadline first, keys, expiry, the bound) are tested directly on ``BatchQueue``.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td
from served import serving

import edgekit
from edgekit.bundle import generate_keypair
from edgekit.pipeline.batch_queue import BatchQueue, Job, QueueClosed, QueueFull
from edgekit.serve import Batching, Limits, Running, ServeOptions, start

from conftest import EDGEKIT, ROOT

grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
from tritonclient.utils import InferenceServerException  # noqa: E402

NAME = "tiny-classifier"


class Gate:
    """Wraps a session's ``run``: each call waits until the test opens the gate; counts the calls."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self.entered = threading.Event()
        self.open = threading.Event()
        self.calls = 0

    def __call__(self, *arrays: Any) -> Any:
        self.calls += 1
        self.entered.set()
        assert self.open.wait(30), "the test never opened the gate"
        return self._run(*arrays)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    keys = generate_keypair(tmp_path_factory.mktemp("keys") / "signer")
    out = tmp_path_factory.mktemp("cls") / "tiny-batch"
    return td.classifier_bundle(out, keys[0], free_batch=True), keys[1]


@pytest.fixture
def model(bundle: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    with edgekit.load(bundle[0], device="x86_64-cpu", trusted_keys=[bundle[1]], measure=False) as m:
        assert m.session.batchable
        yield m


def serve(model: edgekit.Model, max_batch: int = 8, delay_ms: float = 0.0, **limits: Any) -> Running:
    return start(
        model,
        ServeOptions(
            http_port=0, grpc_port=0, limits=Limits(**limits), batching=Batching(max_batch, delay_ms)
        ),
    )


def inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, 3, 32, 32)).astype(np.float32)


def tensor(x: np.ndarray) -> Any:
    inp = grpcclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def frame(seed: int) -> bytes:
    image = np.random.default_rng(seed).integers(0, 256, (48 + seed, 64, 3), dtype=np.uint8)
    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


def picture(data: bytes) -> Any:
    inp = grpcclient.InferInput("IMAGE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([data], dtype=object))
    return inp


def wait_for_depth(running: Running, depth: int) -> None:
    for _ in range(3000):
        if running.service.queue.depth == depth:
            return
        threading.Event().wait(0.01)
    assert running.service.queue.depth == depth


def held_then_released(running: Running, gate: Gate, calls: list[Any]) -> list[Any]:
    """Hold the worker on a first request, queue ``calls`` behind it, open the gate: their results."""
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
    with ThreadPoolExecutor(len(calls) + 1) as pool:
        first = pool.submit(grpc.infer, NAME, [tensor(inputs(99))])
        assert gate.entered.wait(30)  # the worker holds this one, alone
        waiting = [pool.submit(grpc.infer, name, [inp]) for name, inp in calls]
        wait_for_depth(running, len(calls))
        gate.open.set()
        first.result(30)
        return [f.result(30) for f in waiting]


@pytest.mark.parametrize("max_batch", [8, 1], ids=["batched", "off"])
def test_waiting_requests_are_one_inference_with_the_answers_each_gets_alone(
    model: edgekit.Model, max_batch: int
) -> None:
    xs = [inputs(seed) for seed in range(5)]
    pictures = [frame(seed) for seed in range(3)]
    want = [model.session.run(x)[0] for x in xs]
    labels = [model.classify(cv2.imdecode(np.frombuffer(p, np.uint8), cv2.IMREAD_COLOR)) for p in pictures]
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=max_batch)
    try:
        calls = [(NAME, tensor(x)) for x in xs] + [(f"{NAME}-image", picture(p)) for p in pictures]
        got = held_then_released(running, gate, calls)
        for x_want, result in zip(want, got[:5], strict=True):
            np.testing.assert_allclose(result.as_numpy("logits"), x_want, rtol=1e-5, atol=1e-6)
        for lb_want, result in zip(labels, got[5:], strict=True):
            assert [n.decode() for n in result.as_numpy("LABEL_NAMES")] == [lb.name for lb in lb_want]
            np.testing.assert_allclose(
                result.as_numpy("SCORES"), [lb.score for lb in lb_want], rtol=1e-5, atol=1e-6
            )
        runner = running.service.runner
        assert runner.requests == 9
        scrape = running.service.metrics.render()
        assert f"edgekit_serve_inferences_total {runner.inferences}\n" in scrape
        assert "edgekit_serve_batched_requests_total 9\n" in scrape
        if max_batch == 1:
            assert runner.inferences == 9 and gate.calls == 9
        else:
            # The held one alone, then the raw tensors as one batch and the pictures as another.
            assert runner.inferences == 3 and gate.calls == 1
    finally:
        gate.open.set()
        running.stop()


def test_a_batch_holds_at_most_max_batch_requests(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=3, queue_size=16)
    try:
        xs = [inputs(seed) for seed in range(7)]
        held_then_released(running, gate, [(NAME, tensor(x)) for x in xs])
        runner = running.service.runner
        assert runner.requests == 8 and runner.inferences == 1 + 3  # 1, then 3 + 3 + 1
    finally:
        gate.open.set()
        running.stop()


def test_every_batch_size_is_made_before_the_server_is_ready(model: edgekit.Model) -> None:
    # Made on first use, a batch size's first inference waited for its compilation (0.2 s on
    # OpenVINO), and the requests and camera frames in and behind it missed their deadlines.
    made: list[int] = []
    batched = model.session.batched

    def counting(n: int) -> Any:
        made.append(n)
        return batched(n)

    model.session.batched = counting  # type: ignore[method-assign]
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=4, queue_size=16)
    try:
        assert sorted(made) == [2, 3, 4] and gate.calls == 0  # each size once; the warm runs are its own
        xs = [inputs(seed) for seed in range(7)]
        held_then_released(running, gate, [(NAME, tensor(x)) for x in xs])
        assert running.service.runner.inferences == 1 + 2  # 1, then 4 + 3
        assert sorted(made) == [2, 3, 4]  # none made while requests waited
    finally:
        gate.open.set()
        running.stop()


def test_a_burst_past_the_bound_is_refused_at_once_and_never_queued(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8, queue_size=4)
    try:
        port = running.grpc_port
        http = httpclient.InferenceServerClient(f"127.0.0.1:{running.http_port}")
        with ThreadPoolExecutor(6) as pool:
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            waiting = [pool.submit(grpc.infer, NAME, [tensor(inputs(s))]) for s in range(1, 5)]
            wait_for_depth(running, 4)
            refused = []
            for s in range(40):  # the burst: every one answered at once, none waits
                with pytest.raises(InferenceServerException, match="busy") as err:
                    grpc.infer(NAME, [tensor(inputs(s))])
                refused.append(err.value.status())
                assert running.service.queue.depth == 4
            with pytest.raises(InferenceServerException, match="busy") as over_http:
                inp = httpclient.InferInput("input", [1, 3, 32, 32], "FP32")
                inp.set_data_from_numpy(inputs(0))
                http.infer(NAME, [inp])
            assert over_http.value.status() == "429"
            assert set(refused) == {"StatusCode.RESOURCE_EXHAUSTED"}
            gate.open.set()
            for f in (first, *waiting):
                f.result(30)
        runner = running.service.runner
        assert runner.requests == 5 and runner.inferences == 2  # the refused ones never reached it
        assert running.service.metrics.requests()[(NAME, "grpc", "busy")] == 40
    finally:
        gate.open.set()
        running.stop()


def test_expired_requests_are_answered_and_never_computed(model: edgekit.Model) -> None:
    gate = Gate(model.session.run)
    model.session.run = gate  # type: ignore[method-assign]
    running = serve(model, max_batch=8, queue_size=8, deadline_s=0.2)
    try:
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(grpc.infer, NAME, [tensor(inputs(0))])
            assert gate.entered.wait(30)
            late = [pool.submit(grpc.infer, NAME, [tensor(inputs(s))]) for s in range(1, 4)]
            wait_for_depth(running, 3)
            threading.Event().wait(0.3)  # past their deadlines while the first holds the worker
            gate.open.set()
            first.result(30)
            for f in late:
                with pytest.raises(InferenceServerException, match="past its deadline: not computed") as err:
                    f.result(30)
                assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        runner = running.service.runner
        assert runner.requests == 1 and runner.inferences == 1 and gate.calls == 1
    finally:
        gate.open.set()
        running.stop()


def test_a_fixed_batch_model_serves_one_at_a_time(tmp_path: Path) -> None:
    keys = generate_keypair(tmp_path / "signer")
    fixed = td.classifier_bundle(tmp_path / "tiny", keys[0])
    with edgekit.load(fixed, device="x86_64-cpu", trusted_keys=[keys[1]], measure=False) as model:
        running = serve(model, max_batch=8)
        try:
            assert running.service.runner.max_batch == 1
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
            x = inputs(3)
            np.testing.assert_allclose(
                grpc.infer(NAME, [tensor(x)]).as_numpy("logits"), model.session.run(x)[0], rtol=1e-6
            )
        finally:
            running.stop()


def test_the_command_takes_max_batch_and_max_queue_delay(bundle: tuple[Path, Path]) -> None:
    x = inputs(5)
    for args in (("--max-batch", "off"), ("--max-batch", "4", "--max-queue-delay-ms", "2")):
        with serving(bundle[0], "--key", str(bundle[1]), *args) as served:
            got = grpcclient.InferenceServerClient(served.grpc).infer(NAME, [tensor(x)])
            assert got.as_numpy("logits").shape == (1, 10)
    r = subprocess.run(
        [*EDGEKIT, "serve", str(bundle[0]), "--key", str(bundle[1]), "--max-batch", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode != 0 and "--max-batch takes a number >= 1 or off, got '0'" in r.stderr


# The batch queue's rules, without a server.


def job(name: str, deadline: float, key: str | None = "k") -> Job[str]:
    return Job(name, deadline, key)


def test_the_queue_takes_the_earliest_deadline_and_the_jobs_of_its_key() -> None:
    q: BatchQueue[str] = BatchQueue(size=8, max_rows=3)
    far = 1e12
    for j in (job("a", far + 5), job("b", far + 1, "other"), job("c", far + 2), job("d", far + 3)):
        q.put(j)
    q.put(job("e", far + 4))
    q.put(job("f", far + 0.5, None))
    taken = q.take()
    assert taken is not None and [j.payload for j in taken.batch] == ["f"]  # earliest; runs alone
    taken = q.take()
    assert taken is not None and [j.payload for j in taken.batch] == ["b"]  # nothing else has its key
    taken = q.take()
    assert taken is not None and [j.payload for j in taken.batch] == ["c", "d", "e"]  # max_rows, EDF
    taken = q.take()
    assert taken is not None and [j.payload for j in taken.batch] == ["a"] and q.depth == 0


def test_expired_jobs_come_back_apart_from_the_batch() -> None:
    q: BatchQueue[str] = BatchQueue(size=8, max_rows=4)
    q.put(job("gone", 0.0))
    q.put(job("gone too", 1.0))
    q.put(job("live", 1e12))
    taken = q.take()
    assert taken is not None
    assert [j.payload for j in taken.expired] == ["gone", "gone too"]
    assert [j.payload for j in taken.batch] == ["live"]


def test_the_queue_is_bounded_and_refuses_after_close() -> None:
    q: BatchQueue[int] = BatchQueue(size=3, max_rows=8)
    for i in range(3):
        q.put(Job(i))
    for i in range(100):
        with pytest.raises(QueueFull):
            q.put(Job(i))
    assert q.depth == 3
    assert [j.payload for j in q.close()] == [0, 1, 2]
    with pytest.raises(QueueClosed):
        q.put(Job(9))
    assert q.take() is None


def test_a_batch_waits_up_to_the_delay_for_more_of_its_key() -> None:
    # A long delay: the batch closes because it is full, not because time ran out.
    q: BatchQueue[int] = BatchQueue(size=8, max_rows=3, max_delay_s=60.0)
    q.put(Job(0, key="k"))
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(q.take()))
    taker.start()
    for _ in range(3000):
        if q.depth == 0:
            break
        threading.Event().wait(0.01)
    q.put(Job(1, key="other"))  # not its key: stays waiting
    q.put(Job(2, key="k"))
    q.put(Job(3, key="k"))
    taker.join(30)
    assert not taker.is_alive()
    assert [j.payload for j in got[0].batch] == [0, 2, 3] and q.depth == 1


def test_a_lane_has_its_own_bound_and_a_job_that_never_expires_is_run_late() -> None:
    q: BatchQueue[str] = BatchQueue(size=2, max_rows=8, lanes={"frames": 1})
    q.put(Job("r1", 1e12))
    q.put(Job("r2", 1e12))
    with pytest.raises(QueueFull):  # the requests' room is full ...
        q.put(Job("r3", 1e12))
    q.put(Job("late frame", 0.0, expires=False, lane="frames"))  # ... the frames' is not
    assert [j.payload for j in q.put_all([Job("f2", 1e12, lane="frames")])] == ["f2"]
    q.put_all([])
    taken = q.take()
    assert taken is not None and taken.expired == []
    assert [j.payload for j in taken.batch] == ["late frame"]  # past its deadline, still run, first


def test_jobs_put_together_are_taken_together() -> None:
    q: BatchQueue[int] = BatchQueue(size=8, max_rows=8)
    got: list[Any] = []
    taker = threading.Thread(target=lambda: got.append(q.take()))
    taker.start()
    assert q.put_all([Job(i, key="k") for i in range(3)]) == []
    taker.join(30)
    assert [j.payload for j in got[0].batch] == [0, 1, 2]
