"""The Python examples of the README (and of docs/, once there) run as written.

Every ```` ```python ```` block is run, unchanged, in a folder laid out as the README's
commands leave it: ``bundles/enl0-x86`` (a classifier) and ``bundles/blazeface-x86`` (a
detector), here the tests' tiny models, signed with the key ``edgekit keys generate`` made,
for a user with no other trust set up.  A block that cannot run on a test machine is listed
in ``NOT_RUN`` by a line it holds, with the reason; a new block is run unless listed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_detector import classifier_bundle, detector_bundle

from conftest import ROOT, edgekit

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Blocks that need what a test machine lacks, by a line each holds: why.
NOT_RUN = {
    'source="0"': "reads the first camera",
    'open_session("model.onnx")': "a fragment: the reader's own model file, image and artifacts",
    'tracer = trace(p, device_id="cam-7")': (
        "a network camera, a broker and an OTLP collector by name; tests/test_traces.py makes the same calls"
        " against a real broker and an OTLP receiver"
    ),
    'open("cat.jpg", "rb")': (
        "a client of a running `edgekit serve` on its default port; tests/test_serve_clients.py sends"
        " the same JPEG request with tritonclient (gRPC and HTTP) to a server it starts"
    ),
    'tracer = trace_requests(model, device_id="cam-7")': (
        "a fragment: the reader's loaded model, served on ports 8000 and 8001; tests/test_serve_traces.py"
        " makes the same calls against an OTLP receiver"
    ),
    "shared=running.frames()": (
        "a network camera and the first camera beside a server on ports 8000 and 8001;"
        " tests/test_serve_cameras.py makes the same calls with synthetic cameras"
    ),
    'request.headers.get("traceparent")': (
        "a fragment of the reader's own request handler; tests/test_traces.py records request spans"
        " and checks them in an OTLP receiver"
    ),
}
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks() -> list[tuple[str, str]]:
    """``(where, code)`` for every Python block of the docs: ``where`` is ``file:line``."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1)))
    return found


def to_run() -> list[tuple[str, str]]:
    return [(where, code) for where, code in python_blocks() if not any(k in code for k in NOT_RUN)]


def test_the_python_api_example_is_among_those_run() -> None:
    # So that moving or renaming the examples cannot leave this test checking nothing.
    assert any("edgekit.load(" in code and ".classify(" in code for _, code in to_run())
    assert all(any(k in code for _, code in python_blocks()) for k in NOT_RUN), (
        "a NOT_RUN entry matches no block"
    )


@pytest.fixture(scope="module")
def readers_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A working folder with the README's bundles, and the environment of a user with only their own key."""
    home = tmp_path_factory.mktemp("reader")
    env = {k: v for k, v in os.environ.items() if k != "EDGEKIT_TRUST"}
    env |= {"XDG_CONFIG_HOME": str(home / "config"), "EDGEKIT_AGENT_ROOT": str(home / "no-agent")}
    r = edgekit(env, "keys", "generate")
    assert r.returncode == 0, r.stderr
    key = home / "config" / "edgekit" / "keys" / "edgekit.pem"
    classifier_bundle(home / "bundles" / "enl0-x86", key)
    detector_bundle(home / "bundles" / "blazeface-x86", key)
    return home, env


@pytest.mark.parametrize(("where", "code"), to_run(), ids=[where for where, _ in to_run()])
def test_the_example_runs_as_written(
    where: str, code: str, readers_folder: tuple[Path, dict[str, str]]
) -> None:
    folder, env = readers_folder
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=folder
    )
    assert r.returncode == 0, f"{where}:\n{code}\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), f"{where} printed nothing"
