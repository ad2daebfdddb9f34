"""``edgekit serve`` against clients nobody here wrote: tritonclient's HTTP and gRPC clients, unchanged.

The server runs as the user runs it (a subprocess on loopback, stopped with SIGTERM); every
answer is compared with the same bundle loaded in this process by ``edgekit.load``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import tiny_detector as td
from served import Served, serving, start_serve

import edgekit
from edgekit.bundle import generate_keypair

httpclient = pytest.importorskip(
    "tritonclient.http", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
grpcclient = pytest.importorskip(
    "tritonclient.grpc", reason="tritonclient is not installed (pip install -e '.[dev]')"
)
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return generate_keypair(tmp_path_factory.mktemp("keys") / "signer")


@pytest.fixture(scope="module")
def classifier_bundle(tmp_path_factory: pytest.TempPathFactory, signer: tuple[Path, Path]) -> Path:
    return td.classifier_bundle(tmp_path_factory.mktemp("cls") / "tiny", signer[0])


@pytest.fixture(scope="module")
def detector_bundle(tmp_path_factory: pytest.TempPathFactory, signer: tuple[Path, Path]) -> Path:
    return td.detector_bundle(tmp_path_factory.mktemp("det") / "square", signer[0])


@pytest.fixture(scope="module")
def classifier(classifier_bundle: Path, signer: tuple[Path, Path]) -> Iterator[Served]:
    with serving(classifier_bundle, "--key", str(signer[1])) as served:
        yield served


@pytest.fixture(scope="module")
def local(classifier_bundle: Path, signer: tuple[Path, Path]) -> Iterator[edgekit.Model]:
    with edgekit.load(
        classifier_bundle, device="x86_64-cpu", trusted_keys=[signer[1]], measure=False
    ) as model:
        yield model


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (96, 128, 3), dtype=np.uint8)


def png(image: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", image)
    assert ok
    return data.tobytes()


def image_input(module: Any, data: bytes) -> Any:
    inp = module.InferInput("IMAGE", [1], "BYTES")
    inp.set_data_from_numpy(np.array([data], dtype=object))
    return inp


def test_metadata_and_readiness_over_http_and_grpc(classifier: Served, local: edgekit.Model) -> None:
    http = httpclient.InferenceServerClient(classifier.http)
    grpc = grpcclient.InferenceServerClient(classifier.grpc)
    assert (
        http.is_server_live() and http.is_server_ready() and grpc.is_server_live() and grpc.is_server_ready()
    )
    assert http.is_model_ready("tiny-classifier") and grpc.is_model_ready("tiny-classifier-image")
    assert not http.is_model_ready("nothing-here") and not grpc.is_model_ready("nothing-here")
    assert http.get_server_metadata()["extensions"] == ["binary_tensor_data"]
    assert grpc.get_server_metadata(as_json=True)["name"] == "edgekit"
    spec = local.session.inputs[0]
    for meta in (
        http.get_model_metadata("tiny-classifier"),
        grpc.get_model_metadata("tiny-classifier", as_json=True),
    ):
        assert meta["name"] == "tiny-classifier" and meta["versions"] == ["1.0"]
        (inp,) = meta["inputs"]
        assert inp["name"] == spec.name and inp["datatype"] == "FP32"
        assert [int(d) for d in inp["shape"]] == [-1 if d is None else d for d in spec.shape]
        assert [o["name"] for o in meta["outputs"]] == [o.name for o in local.session.outputs]
    image_meta = http.get_model_metadata("tiny-classifier-image")
    assert image_meta["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": [1]}]
    assert [o["name"] for o in image_meta["outputs"]] == ["LABEL_IDS", "LABEL_NAMES", "SCORES"]
    with pytest.raises(InferenceServerException, match="no model 'nothing-here'"):
        http.get_model_metadata("nothing-here")
    with pytest.raises(InferenceServerException, match=r"version 1\.0, not '7'"):
        grpc.get_model_metadata("tiny-classifier", "7")


def test_raw_tensors_binary_and_json_over_http_and_raw_over_grpc(
    classifier: Served, local: edgekit.Model
) -> None:
    spec, out = local.session.inputs[0], local.session.outputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    want = local.session.run(x)[0]
    http = httpclient.InferenceServerClient(classifier.http)
    for binary in (True, False):
        inp = httpclient.InferInput(spec.name, shape, "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        asked = [httpclient.InferRequestedOutput(out.name, binary_data=binary)]
        got = http.infer("tiny-classifier", [inp], outputs=asked).as_numpy(out.name)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    inp = grpcclient.InferInput(spec.name, shape, "FP32")
    inp.set_data_from_numpy(x)
    got = grpcclient.InferenceServerClient(classifier.grpc).infer("tiny-classifier", [inp]).as_numpy(out.name)
    np.testing.assert_array_equal(got, want)


def test_images_come_back_as_the_same_labels_as_in_process(classifier: Served, local: edgekit.Model) -> None:
    http = httpclient.InferenceServerClient(classifier.http)
    grpc = grpcclient.InferenceServerClient(classifier.grpc)
    for seed in range(3):
        image = frame(seed)
        want = local.classify(image, k=3)
        data = png(image)
        params = {"top_k": 3}
        answers = [
            http.infer("tiny-classifier-image", [image_input(httpclient, data)], parameters=params),
            grpc.infer("tiny-classifier-image", [image_input(grpcclient, data)], parameters=params),
        ]
        tensor = grpcclient.InferInput("IMAGE", list(image.shape), "UINT8")
        tensor.set_data_from_numpy(image)
        answers.append(grpc.infer("tiny-classifier-image", [tensor], parameters=params))
        for got in answers:
            assert got.as_numpy("LABEL_IDS").tolist() == [lb.id for lb in want]
            assert [n.decode() for n in got.as_numpy("LABEL_NAMES")] == [lb.name for lb in want]
            np.testing.assert_allclose(got.as_numpy("SCORES"), [lb.score for lb in want], rtol=1e-6)


def test_bad_tensors_are_protocol_errors_and_the_server_keeps_serving(
    classifier: Served, local: edgekit.Model
) -> None:
    http = httpclient.InferenceServerClient(classifier.http)
    grpc = grpcclient.InferenceServerClient(classifier.grpc)
    spec = local.session.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    wrong_shape = [*shape[:-1], shape[-1] + 1]
    bad = httpclient.InferInput(spec.name, wrong_shape, "FP32")
    bad.set_data_from_numpy(np.zeros(wrong_shape, np.float32))
    with pytest.raises(InferenceServerException, match=r"shape .* the model takes") as err:
        http.infer("tiny-classifier", [bad])
    assert err.value.status() == "400"
    f64 = grpcclient.InferInput(spec.name, shape, "FP64")
    f64.set_data_from_numpy(np.zeros(shape, np.float64))
    with pytest.raises(InferenceServerException, match="datatype FP64, the model takes FP32") as err:
        grpc.infer("tiny-classifier", [f64])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    named = grpcclient.InferInput("nope", shape, "FP32")
    named.set_data_from_numpy(np.zeros(shape, np.float32))
    with pytest.raises(InferenceServerException, match="has no input 'nope'"):
        grpc.infer("tiny-classifier", [named])
    with pytest.raises(InferenceServerException, match="not a JPEG or PNG"):
        http.infer("tiny-classifier-image", [image_input(httpclient, b"GIF89a not a picture")])
    with pytest.raises(InferenceServerException, match="top_k must be an integer from 1 to 100"):
        http.infer("tiny-classifier-image", [image_input(httpclient, png(frame(0)))], parameters={"top_k": 0})
    # Not tritonclient: a raw body that lies about its binary part, and one that is not JSON.
    url = f"http://{classifier.http}/v2/models/tiny-classifier/infer"
    for body, headers, needle in (
        (b'{"inputs": [', {}, "not valid JSON"),
        (
            b'{"inputs":[{"name":"input","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":99}}]}',
            {"Inference-Header-Content-Length": "96"},
            "does not fit",
        ),
    ):
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as http_err:
            urllib.request.urlopen(req, timeout=10)
        assert http_err.value.code == 400 and needle in http_err.value.read().decode()
    assert classifier.proc.poll() is None
    assert http.is_server_ready() and grpc.is_model_ready("tiny-classifier")


def test_metrics_count_requests_by_outcome_and_time_each_stage(classifier: Served) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    http = httpclient.InferenceServerClient(classifier.http)
    http.infer("tiny-classifier-image", [image_input(httpclient, png(frame(9)))])
    for made_up in ("nothing-here-1", "nothing-here-2"):
        with pytest.raises(InferenceServerException, match="no model"):
            http.infer(made_up, [image_input(httpclient, b"x")])
    with pytest.raises(InferenceServerException):
        http.infer("tiny-classifier-image", [image_input(httpclient, b"nope")])
    text = urllib.request.urlopen(f"http://{classifier.http}/metrics", timeout=10).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    unknown = [s for s in families["edgekit_serve_requests"].samples if s.labels["model"] == "(unknown)"]
    assert [(s.labels["outcome"], s.value) for s in unknown] == [("not_found", 2.0)]
    counts = {
        (s.labels["model"], s.labels["protocol"], s.labels["outcome"]): s.value
        for s in families["edgekit_serve_requests"].samples
    }
    assert counts[("tiny-classifier-image", "http", "ok")] >= 1
    assert counts[("tiny-classifier-image", "http", "invalid")] >= 1
    assert not any(model.startswith("nothing-here") for model, _, _ in counts)  # not a label per made-up name
    stages = {
        s.labels["stage"]
        for s in families["edgekit_serve_stage_seconds"].samples
        if s.name.endswith("_count") and s.labels["model"] == "tiny-classifier-image" and s.value > 0
    }
    assert stages == {"queue", "decode", "preprocess", "infer", "postprocess", "request"}


def test_the_square_detectors_boxes_come_back_in_frame_pixels(
    detector_bundle: Path, signer: tuple[Path, Path]
) -> None:
    image = td.square_frame(2, 1)
    with edgekit.load(detector_bundle, device="x86_64-cpu", trusted_keys=[signer[1]], measure=False) as model:
        want = model.detect(image)
    assert [d.box for d in want] == [td.cell_box(2, 1)]
    with serving(detector_bundle, "--key", str(signer[1])) as served:
        for got in (
            httpclient.InferenceServerClient(served.http).infer(
                "square-detector-image", [image_input(httpclient, png(image))]
            ),
            grpcclient.InferenceServerClient(served.grpc).infer(
                "square-detector-image", [image_input(grpcclient, png(image))]
            ),
        ):
            assert got.as_numpy("BOXES").tolist() == [list(d.box) for d in want]
            assert [n.decode() for n in got.as_numpy("CLASS_NAMES")] == [td.SQUARE]
            assert got.as_numpy("CLASS_IDS").tolist() == [0]
            np.testing.assert_allclose(got.as_numpy("SCORES"), [d.score for d in want], rtol=1e-6)


def test_the_reference_detector_finds_the_same_faces(tmp_path_factory: pytest.TempPathFactory) -> None:
    from detector_bundle import blazeface_key, build_blazeface
    from skimage import data

    out = tmp_path_factory.mktemp("blazeface")
    bundle = build_blazeface(out)
    public = blazeface_key(out)[1]
    image = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    decoded = cv2.imdecode(jpeg, cv2.IMREAD_COLOR)
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=[public], measure=False) as model:
        want = model.detect(decoded)
    assert want, "BlazeFace finds the astronaut's face"
    with serving(bundle, "--key", str(public)) as served:
        for got in (
            httpclient.InferenceServerClient(served.http).infer(
                f"{model.name}-image", [image_input(httpclient, jpeg.tobytes())]
            ),
            grpcclient.InferenceServerClient(served.grpc).infer(
                f"{model.name}-image", [image_input(grpcclient, jpeg.tobytes())]
            ),
        ):
            np.testing.assert_allclose(got.as_numpy("BOXES"), [d.box for d in want], rtol=1e-5, atol=1e-3)
            assert [n.decode() for n in got.as_numpy("CLASS_NAMES")] == [d.name for d in want]


@pytest.mark.slow
def test_the_reference_classifier_gives_the_same_labels(x86_bundle: tuple[Path, dict[str, Any]]) -> None:
    from skimage import data

    bundle = x86_bundle[0]
    image = cv2.cvtColor(data.chelsea(), cv2.COLOR_RGB2BGR)
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    with edgekit.load(bundle, device="x86_64-cpu", measure=False) as model:
        want = model.classify(cv2.imdecode(jpeg, cv2.IMREAD_COLOR))
        spec = model.session.inputs[0]
        x = model.preprocessor()(image)
        raw = model.session.run(x)[0]
    with serving(bundle) as served:
        name = f"{model.name}-image"
        for got in (
            httpclient.InferenceServerClient(served.http).infer(
                name, [image_input(httpclient, jpeg.tobytes())]
            ),
            grpcclient.InferenceServerClient(served.grpc).infer(
                name, [image_input(grpcclient, jpeg.tobytes())]
            ),
        ):
            assert [n.decode() for n in got.as_numpy("LABEL_NAMES")] == [lb.name for lb in want]
            np.testing.assert_allclose(
                got.as_numpy("SCORES"), [lb.score for lb in want], rtol=1e-5, atol=1e-6
            )
        inp = grpcclient.InferInput(spec.name, list(x.shape), "FP32" if x.dtype == np.float32 else "UINT8")
        inp.set_data_from_numpy(x)
        got_raw = grpcclient.InferenceServerClient(served.grpc).infer(model.name, [inp])
        np.testing.assert_array_equal(got_raw.as_numpy(model.session.outputs[0].name), raw)


def test_a_token_is_required_when_set_and_health_stays_open(
    classifier_bundle: Path, signer: tuple[Path, Path], tmp_path: Path
) -> None:
    token = "s3rve-token-for-the-tests-0123456789"
    token_file = tmp_path / "serve.token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    with serving(classifier_bundle, "--key", str(signer[1]), "--token-file", str(token_file)) as served:
        http = httpclient.InferenceServerClient(served.http)
        grpc = grpcclient.InferenceServerClient(served.grpc)
        assert http.is_server_live() and grpc.is_server_ready()  # probes need no token
        with pytest.raises(InferenceServerException, match="needs its token"):
            http.get_model_metadata("tiny-classifier")
        with pytest.raises(InferenceServerException, match="needs its token") as err:
            grpc.get_model_metadata("tiny-classifier")
        assert err.value.status() == "StatusCode.UNAUTHENTICATED"
        with pytest.raises(InferenceServerException, match="needs its token"):
            http.get_model_metadata(
                "tiny-classifier", headers={"Authorization": "Bearer wrong-token-0123456789"}
            )
        auth = {"authorization": f"Bearer {token}"}
        assert http.get_model_metadata("tiny-classifier", headers=auth)["name"] == "tiny-classifier"
        got = grpc.infer("tiny-classifier-image", [image_input(grpcclient, png(frame(1)))], headers=auth)
        assert got.as_numpy("LABEL_IDS").shape == (5,)
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(f"http://{served.http}/metrics", timeout=10)
        assert no_token.value.code == 401


def test_off_loopback_without_a_token_it_refuses_to_start(
    classifier_bundle: Path, signer: tuple[Path, Path]
) -> None:
    import subprocess

    from conftest import EDGEKIT, ROOT

    r = subprocess.run(
        [*EDGEKIT, "serve", str(classifier_bundle), "--host", "0.0.0.0", "--key", str(signer[1])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "EDGEKIT_SERVE_TOKEN"},
    )
    assert r.returncode == 2, r.stderr
    assert "--host 0.0.0.0 would let anyone" in r.stderr and "--token-file" in r.stderr
    assert "Traceback" not in r.stderr


def test_sigterm_stops_it_cleanly(classifier_bundle: Path, signer: tuple[Path, Path]) -> None:
    from served import stop_serve

    served = start_serve(classifier_bundle, "--key", str(signer[1]))
    assert httpclient.InferenceServerClient(served.http).is_server_ready()
    assert stop_serve(served) == 0
    assert any("stopping" in line for line in served.stderr), "".join(served.stderr)


def test_the_guides_curl_block_runs_against_the_server(
    classifier: Served, local: edgekit.Model, tmp_path: Path
) -> None:
    from conftest import ROOT

    guide = (ROOT / "docs" / "guides" / "serve.md").read_text()
    block = guide.split("## curl", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    script = block.replace("127.0.0.1:8000", classifier.http).replace("efficientnet-lite0", "tiny-classifier")
    image = frame(4)
    ok, jpeg = cv2.imencode(".jpg", image)
    assert ok
    (tmp_path / "cat.jpg").write_bytes(jpeg.tobytes())
    r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ready, rest = r.stdout.split("\n", 1)
    metadata, end = json.JSONDecoder().raw_decode(rest)  # curl prints each body as it came, no newline
    answer = json.loads(rest[end:])
    assert ready == "200" and metadata["name"] == "tiny-classifier-image"
    outputs = {o["name"]: o for o in answer["outputs"]}
    want = local.classify(cv2.imdecode(jpeg, cv2.IMREAD_COLOR), k=3)
    assert outputs["LABEL_NAMES"]["data"] == [lb.name for lb in want]
    np.testing.assert_allclose(outputs["SCORES"]["data"], [lb.score for lb in want], rtol=1e-5)


@pytest.mark.filterwarnings("ignore:ssl.match_hostname:DeprecationWarning")  # geventhttpclient's own
def test_tls_on_both_protocols(classifier_bundle: Path, signer: tuple[Path, Path], tmp_path: Path) -> None:
    import functools
    import ssl

    from edgekit.testing.certs import ThrowawayCA

    ca = ThrowawayCA(tmp_path)
    cert, key = ca.issue("serve", ip="127.0.0.1")
    with serving(
        classifier_bundle, "--key", str(signer[1]), "--tls-cert", str(cert), "--tls-key", str(key)
    ) as served:
        trusting = functools.partial(ssl.create_default_context, cafile=str(ca.ca_file))
        http = httpclient.InferenceServerClient(served.http, ssl=True, ssl_context_factory=trusting)
        grpc = grpcclient.InferenceServerClient(served.grpc, ssl=True, root_certificates=str(ca.ca_file))
        assert http.is_server_ready() and grpc.is_server_ready()
        data = png(frame(2))
        h = http.infer("tiny-classifier-image", [image_input(httpclient, data)]).as_numpy("LABEL_IDS")
        g = grpc.infer("tiny-classifier-image", [image_input(grpcclient, data)]).as_numpy("LABEL_IDS")
        assert h.tolist() == g.tolist() and len(h) == 5
        with pytest.raises(OSError):  # plain HTTP on a TLS port gets no answer
            urllib.request.urlopen(f"http://{served.http}/v2/health/ready", timeout=10)


GENERATED_CLIENT = """
import json, sys
import grpc
import numpy as np
import open_inference_grpc_pb2 as pb
import open_inference_grpc_pb2_grpc as rpc

stub = rpc.GRPCInferenceServiceStub(grpc.insecure_channel(sys.argv[1]))
meta = stub.ModelMetadata(pb.ModelMetadataRequest(name=sys.argv[2]))
x = np.load(sys.argv[3])
request = pb.ModelInferRequest(model_name=sys.argv[2])
request.inputs.add(name=meta.inputs[0].name, datatype="FP32", shape=list(x.shape))
request.raw_input_contents.append(x.astype("<f4").tobytes())
answer = stub.ModelInfer(request)
out = answer.outputs[0]
y = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(list(out.shape))
print(json.dumps({
    "live": stub.ServerLive(pb.ServerLiveRequest()).live,
    "outputs": [o.name for o in meta.outputs],
    "y": y.tolist(),
}))
"""


def test_the_protocols_own_generated_grpc_client(
    classifier: Served, local: edgekit.Model, tmp_path: Path
) -> None:
    """Stubs grpc_tools generates from the protocol's .proto, in a process of their own (their
    messages and tritonclient's share the names ``inference.*`` in protobuf's default pool)."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed (pip install -e '.[dev]')")
    from grpc_tools import protoc

    from conftest import ROOT

    proto_dir = ROOT / "edgekit" / "serve" / "proto"
    rc = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            "open_inference_grpc.proto",
        ]
    )
    assert rc == 0
    spec = local.session.inputs[0]
    x = (
        np.random.default_rng(5)
        .standard_normal([1 if d is None else d for d in spec.shape])
        .astype(np.float32)
    )
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "client.py").write_text(GENERATED_CLIENT)
    r = subprocess.run(
        [sys.executable, "client.py", classifier.grpc, "tiny-classifier", "x.npy"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # nothing of edgekit's
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["live"] and got["outputs"] == [o.name for o in local.session.outputs]
    np.testing.assert_array_equal(np.array(got["y"], np.float32), local.session.run(x)[0])


def test_http_answers_match_the_protocols_own_rest_schemas(classifier: Served) -> None:
    """Each JSON answer against the schema KServe's OpenAPI document (edgekit/serve/proto/) gives it."""
    import jsonschema
    import yaml

    from conftest import ROOT

    spec = yaml.safe_load((ROOT / "edgekit" / "serve" / "proto" / "open_inference_rest.yaml").read_text())

    def check(doc: Any, schema: str) -> None:
        root = {"components": spec["components"], **spec["components"]["schemas"][schema]}
        jsonschema.validate(doc, root)

    base = f"http://{classifier.http}"

    def get(path: str) -> Any:
        try:
            with urllib.request.urlopen(base + path, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    def post(path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return json.loads(err.read())

    check(get("/v2"), "metadata_server_response")
    check(get("/v2/models/tiny-classifier"), "metadata_model_response")
    check(get("/v2/models/tiny-classifier-image/versions/1.0"), "metadata_model_response")
    check(get("/v2/models/nothing-here"), "metadata_model_error_response")
    request = {
        "id": "42",
        "inputs": [
            {
                "name": "IMAGE",
                "datatype": "UINT8",
                "shape": [96, 128, 3],
                "data": frame(6).reshape(-1).tolist(),
            }
        ],
        "outputs": [{"name": "LABEL_NAMES"}, {"name": "SCORES"}],
    }
    check(request, "inference_request")
    answer = post("/v2/models/tiny-classifier-image/infer", request)
    check(answer, "inference_response")
    assert answer["id"] == "42" and [o["name"] for o in answer["outputs"]] == ["LABEL_NAMES", "SCORES"]
    request["inputs"][0]["shape"] = [96, 128, 4]
    check(post("/v2/models/tiny-classifier-image/infer", request), "inference_error_response")
