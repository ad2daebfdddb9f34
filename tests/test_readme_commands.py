"""The shell commands of the README and of docs/ run as written.

Every ```` ```bash ````, ```` ```sh ```` and ```` ```console ```` block is split into commands
(``\\`` continuations joined, ``# comments`` and ``$`` prompts dropped) and each command is, by
the tables below, either

* run as written, in order within its block, by ``bash`` in one working folder shared by all
  blocks (``models/``, ``devices/`` and ``tools/`` hold links to this checkout's files and
  ``.venv`` is its venv, so the README's relative paths resolve), with ``HOME`` a fresh folder
  (``edgekit keys generate`` writes there) and this venv's ``edgekit`` first on ``PATH``; it
  must exit 0, and print what the docs show it print (``# lines`` right under it);
* run after a documented substitution (``SUBSTITUTIONS``: only what cannot exist on a test
  machine: a camera (a network one becomes a real RTSP server on loopback), a broker or a
  device by name, root's folders, ports other users may hold; the reader's own files the
  guides name, ``clip.mp4``, ``photos/`` and ``yolov8n.onnx``, are made in the folder, the last
  a stand-in that says what YOLOv8n's export says); or
* skipped, by its exact text, with the reason (``SKIPPED``).

A command not in ``SKIPPED`` is run, so a command added to the docs either runs as written
or is skipped here with its reason; an entry of either table that matches no command fails.
Commands that serve until stopped (``LONG_RUNNING``) must still be running, and answering
where they serve HTTP, a few seconds after they start; then they are stopped.

The blocks run in document order (README first) because later ones use what earlier ones
made: the README builds ``bundles/enl0-x86`` that the guides run and deploy.  That build
reuses the session's build cache, warmed by the ``x86_bundle`` fixture that other tests share,
so it takes seconds here; blocks that build or deploy are marked ``slow`` (CI runs them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rtsp_server import RtspCamera, rtsp_server_missing
from sshd import Sshd

from edgekit.core.paths import config_root
from edgekit.testing.mosquitto import Mosquitto, free_port

from conftest import ROOT

# CONTRIBUTING.md is a page of the site (docs/contributing.md includes it); devices/README.md is
# the profile format's guide.
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "CONTRIBUTING.md",
    ROOT / "devices" / "README.md",
]
FENCE = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.DOTALL | re.MULTILINE)

SERVE_CURL = (
    "the server the guide starts is stopped once it answers; tests/test_serve_clients.py runs this block"
)
#: The guide's image request over curl (docs/guides/serve.md), one command.
SERVE_INFER = (
    'n=$(stat -c %s cat.jpg); head=\'{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1],'
    '"parameters":{"binary_data_size":\'$((n + 4))\'}}],"outputs":[{"name":"LABEL_NAMES"},'
    '{"name":"SCORES"}],"parameters":{"top_k":3}}\'; { printf %s "$head"; python3 -c "import struct, sys; '
    "sys.stdout.buffer.write(struct.pack('<I', $n))\"; cat cat.jpg; } > request.bin; curl -s "
    'http://127.0.0.1:8000/v2/models/efficientnet-lite0-image/infer -H "Inference-Header-Content-Length: '
    '${#head}" --data-binary @request.bin'
)
#: The serve guide's request with a caller's traceparent (docs/guides/serve.md, "Traces").
SERVE_TRACEPARENT = (
    "curl -s http://127.0.0.1:8000/v2/models/efficientnet-lite0-image/infer -H 'traceparent: "
    '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\' -d \'{"inputs":[{"name":"IMAGE",'
    '"datatype":"UINT8","shape":[2,2,3],"data":[0,0,255,0,0,255,0,0,255,0,0,255]}]}\''
)

#: Commands not run, by their exact text (continuations joined, comment dropped): why.
SKIPPED = {
    # The set-up commands: .ci/run runs tools/setup.sh and pytest itself, and tools/fresh_check.sh
    # runs `tools/setup.sh` then `edgekit demo` on a fresh Debian root.
    "tools/setup.sh && .venv/bin/edgekit demo": "set-up; .ci/run's fresh-machine check (tools/fresh_check.sh) runs it",
    ".venv/bin/python -m pytest": "this test is part of it",
    # The contributor's checks: .ci/run runs each of them on this checkout.
    "tools/setup.sh": "set-up; .ci/run runs it first, and its fresh-machine check on a clean Debian root",
    ".venv/bin/ruff check edgekit tests tools benchmarks && .venv/bin/ruff format --check edgekit tests tools "
    "benchmarks": ".ci/run runs it on the checkout (here the folder is the reader's, not a checkout)",
    ".venv/bin/mypy": ".ci/run runs it on the checkout",
    ".venv/bin/lint-imports": ".ci/run runs it; tests/test_layers.py checks the same contracts",
    ".venv/bin/python -m pytest -q tests/test_<what you touched>.py": "a placeholder; this test is part of pytest",
    ".venv/bin/mkdocs build --strict": "tests/test_docs.py builds the site strictly",
    # edgekit serve: off loopback it needs a token and here a certificate; the tests serve with a token.
    "edgekit serve bundles/enl0-x86 --host 0.0.0.0 --token-file serve.token --tls-cert serve.crt "
    "--tls-key serve.key": "needs the reader's token and certificate; tests/test_serve_clients.py serves with a token",
    "curl -s http://127.0.0.1:8000/v2/health/ready -o /dev/null -w '%{http_code}\\n'": SERVE_CURL,
    "curl -s http://127.0.0.1:8000/v2/models/efficientnet-lite0-image": SERVE_CURL,
    SERVE_INFER: SERVE_CURL,
    SERVE_TRACEPARENT: (
        "the server the guide starts does not trace; tests/test_serve_traces.py runs this command against "
        "'edgekit serve --trace' and an OTLP receiver, and checks the caller's trace continues"
    ),
    # ARM64: containers and binfmt as root.
    "podman build --arch arm64 --format docker -f Dockerfile.arm64 -t edgekit-device:arm64 .": (
        "builds the arm64 device image under QEMU (tens of minutes); tools/arm64_check.sh does, in .ci/run"
    ),
    "tools/arm64_check.sh": "root and binfmt_misc; .ci/run runs it after pytest",
    # Minutes of measuring on a shared 2-core machine; the same options run on the tiny bundle there.
    "edgekit bench bundles/enl0-x86": "every candidate for minutes; tests/test_bench.py runs bench on small bundles",
    "edgekit bench bundles/enl0-x86 --backends onnxruntime,openvino --precisions int8 --threads 1,2": (
        "minutes of measuring; tests/test_bench.py covers --backends/--precisions/--threads"
    ),
    "edgekit bench bundles/enl0-x86 --json --samples --plot latency.html": (
        "minutes of measuring; tests/test_bench.py covers --json/--samples/--plot"
    ),
    "edgekit bench bundles/enl0-x86 --write-selection --sign-key ~/.config/edgekit/keys/edgekit.pem": (
        "minutes of measuring; tests/test_bench.py writes a selection"
    ),
    "edgekit build --model models/efficientnet-lite0 --device x86 --select fastest --sign-key KEY": (
        "benches every candidate during the build (minutes); tests/test_bench.py runs --select fastest"
    ),
    # The reader's own files.
    "edgekit build --model models/efficientnet-lite0 --device jetson -o bundles/enl0-jetson.tar.gz": (
        "the Jetson bundle takes minutes more; tests/test_build.py builds it"
    ),
    "edgekit build --onnx my.onnx --mean 123.675,116.28,103.53 --std 58.395,57.12,57.375 "
    "--labels labels.txt --device pi": "the reader's own model and labels; tests/test_file_card.py builds from --onnx",
    "edgekit build --onnx yolov8n.onnx --device x86_64-cpu -o bundles/yolo-x86": (
        "YOLOv8n's export (ultralytics) is not here, and a 640x640 build for every backend takes"
        " minutes; the --write-card below prints the same inferred lines from a stand-in file,"
        " and tests/test_build_user_detector.py builds a detector from a file"
    ),
    # The device side, as root.
    "sudo edgekit agent trust builder.pub.pem [--root /var/lib/edgekit]": "sudo on the device; the deploy below trusts the key the same way",
    "edgekit deploy --device jetson --model models/efficientnet-lite0 --sign-key builder.pem --host ubuntu@10.0.0.7": (
        "a Jetson over SSH (builds for it first); the x86_64 deploy below runs over a real sshd"
    ),
    "edgekit deploy --fleet lab --group line-2 --bundle bundles/enl0-x86 --mqtt mqtt://broker.local "
    "--sign-key builder.pem --artifacts /srv/edgekit/artifacts --artifact-url http://fleet.local:8765/artifacts "
    "--canary 10% --canary-window 5m": "a fleet of agents answering over MQTT; tests/test_deploy_mqtt.py",
    "edgekit deploy rollback --fleet lab --target cam-7 --mqtt mqtt://broker.local --sign-key builder.pem": (
        "a fleet agent answering over MQTT; tests/test_deploy_mqtt.py"
    ),
    "edgekit deploy --fleet lab --group line-2 --bundle bundles/enl0-x86 --mqtt mqtt://broker.local "
    "--sign-key builder.pem --artifacts /srv/edgekit/artifacts --artifact-url http://fleet.local:8765/artifacts "
    "--waves 1,10,50,100 --wave-window 5m --slo-p95-ms 30 --state /var/lib/edgekit-rollouts/line-2.json "
    "--state-db postgresql://edgekit@db.local/fleet": (
        "a fleet of agents answering over MQTT; tests/test_deploy_waves.py runs waves against 100 simulated ones"
    ),
    "edgekit deploy control pause --fleet lab --id d-20261205T174000-3f2a91c0-7b1e --mqtt mqtt://broker.local": (
        "steers a running wave rollout; tests/test_deploy_waves.py pauses, resumes and aborts one"
    ),
    "edgekit deploy control abort --fleet lab --id d-20261205T174000-3f2a91c0-7b1e --mqtt mqtt://broker.local "
    '--reason "p99 up on line 2"': "steers a running wave rollout; tests/test_deploy_waves.py aborts one",
    # Services this machine does not have.
    "edgekit fleet collect --mqtt mqtt://broker.local --db fleet.db --remote-write http://vm.local:8428/api/v1/write": (
        "a VictoriaMetrics by name; tests/test_fleet_remote_write.py runs fleet collect --remote-write against a "
        "real VictoriaMetrics and Mosquitto"
    ),
    "edgekit fleet serve --mqtt mqtts://fleet@broker.local:8883 --mqtt-ca ca.pem "
    "--db postgresql://edgekit@db.local/fleet --host 0.0.0.0 --token-file fleet.token [--allowed-host fleet.local] "
    "[--raw-keep 1h] [--keep 30d] [--hour-keep 400d] [--slo-for 5m] [--max-devices 10000]": (
        "a TLS broker and PostgreSQL; tests/test_secrets.py, tests/test_fleet_serve.py and tests/test_fleet_store.py"
    ),
    **dict.fromkeys(
        [
            f"edgekit fleet collect --mqtt mqtts://fleet@broker.local:8883 --mqtt-ca ca.pem --share collectors "
            f"--client-id collector-{i}"
            for i in (1, 2)
        ],
        "a TLS broker and PostgreSQL by name; tests/test_fleet_collect.py runs two collectors of a group"
        " against a real Mosquitto and PostgreSQL",
    ),
    "edgekit run ... --mqtt mqtts://cam-7@broker.local:8883 --mqtt-ca ca.pem [--mqtt-cert c.pem --mqtt-key c.key]": (
        "a fragment ('...'); tests/test_telemetry.py and tests/test_fleet_mqtt.py use TLS"
    ),
    # Tracing: an install from the registry, a network camera and a collector by name.
    "pip install 'edgekit[tracing]'": "an install from PyPI; tools/setup.sh installs edgekit[all], tracing's extra included",
    "edgekit run bundles/enl0-x86 --source rtsp://door.local/stream --trace "
    "[--mqtt mqtt://broker.local --device-id cam-7]": (
        "a network camera and an OTLP collector by name; tests/test_traces.py runs 'edgekit run --trace'"
        " against an OTLP receiver, and without an endpoint"
    ),
    # A dated measurement's recipe: its own data sets and minutes of building.
    "python -m benchmarks.labelled_sets documents pages": "a measurement's recipe (docs/measurements)",
    "python -m benchmarks.labelled_sets documents calib --seed 7": "a measurement's recipe (docs/measurements)",
    "edgekit build --model models/yolov8n-doclaynet --device x86_64-cpu -o B --calibration calib/images "
    "--eval-coco pages/annotations.json --eval-images pages/images": "a measurement's recipe (docs/measurements)",
    "edgekit eval B --coco pages/annotations.json --images pages/images": "a measurement's recipe (docs/measurements)",
    "edgekit bench B --threads 2 --min-duration 3 --min-queries 20 --max-duration 8 --fps 0": (
        "a measurement's recipe (docs/measurements)"
    ),
    # Serve's costs (docs/measurements): minutes of clients and servers on the reference bundle.
    **dict.fromkeys(
        [
            "python -m benchmarks.serve_overhead --json",
            "python -m benchmarks.serve_throughput --kind tensor --json",
            "python -m benchmarks.serve_throughput --kind image --json",
            "python -m benchmarks.serve_throughput --kind image --cameras 4 --deadline 0.2 --json",
        ],
        "a measurement's recipe (docs/measurements); tests/test_serve_*.py test what it measures",
    ),
    "python -m benchmarks.trace_cost --rounds 3 --frames 300": (
        "a measurement's recipe (docs/measurements); tests/test_traces.py tests what it measures"
    ),
    # Soaks: an hour (or minutes) of four live cameras; tests/test_soak.py runs the CI-sized soak.
    "python -m benchmarks.soak --minutes 60 --cameras 4 --fps 30 --restart-every 180 --json > soak.json": (
        "an hour-long soak; tests/test_soak.py runs the CI-sized one"
    ),
    "python -m benchmarks.soak --minutes 45 --json > soak.json": (
        "a 45-minute soak (docs/measurements); tests/test_soak.py runs the CI-sized one"
    ),
    "python -m benchmarks.soak --minutes 60 --json > soak.json": (
        "an hour-long soak (docs/measurements); tests/test_soak.py runs the CI-sized one"
    ),
    "python -m benchmarks.soak --minutes 1.75 --window 10 --restart-every 20 --warmup 20 --p99-every 35": (
        "a measurement's recipe (docs/measurements); tests/test_soak.py runs the CI-sized soak"
    ),
    # 10,000 simulated devices for 10 minutes; tests/test_fleet_scale.py runs the CI-sized fleet.
    **dict.fromkeys(
        [
            "python -m benchmarks.fleet_scale --devices 10000 --minutes 10 --json",
            "python -m benchmarks.fleet_scale --devices 10000 --minutes 10 --kill --json",
        ],
        "10,000 devices for 10 minutes (docs/measurements); tests/test_fleet_scale.py runs 200 for 24 s",
    ),
    "python -m benchmarks.fleet_rollup_size --devices 100 --hours 2": (
        "a measurement's recipe (docs/measurements); tests/test_fleet_store.py tests the compaction it sizes"
    ),
}


@dataclass(frozen=True)
class Substitution:
    pattern: str
    replacement: str  # formatted with the Folder's fields
    why: str


SUBSTITUTIONS = [
    Substitution(
        r"python -m benchmarks\.event_cost --json",
        "python -m benchmarks.event_cost --frames 200 --seconds 1 --rounds 1 --json",
        "a measurement's recipe (docs/measurements), run at its smallest: a minute as written",
    ),
    # Options in [brackets] are optional: they are run (so that they exist), but for these.
    Substitution(
        r" \[--port 2222\] \[--key id_ed25519\]", "", "the sshd's own port and key are given instead"
    ),
    Substitution(
        r"\[--spool /var/lib/edgekit/spool\.db\]", "--spool spool.db", "not the system's state folder"
    ),
    Substitution(
        r" \[--measure\]", "", "measures every candidate for minutes; tests/test_measured_selection.py"
    ),
    Substitution(r"\[(--[^\]]*)\]", r"\1", "options in [brackets]: run with them"),
    Substitution(
        r"^edgekit serve bundles/enl0-x86 --source rtsp://door/s1 --source 0 (.*)$",
        r"edgekit serve bundles/enl0-x86 --source synthetic:320x240@30 --source synthetic:320x240@30 \1"
        r" --http-port {http_port} --grpc-port 0",
        "no cameras here: two synthetic ones; ports 8000 and 8001 may be another user's",
    ),
    Substitution(
        r"--source 0 --preview :8080",
        "--source synthetic:320x240@30 --preview 127.0.0.1:{http_port}",
        "no camera here; the live view serves until stopped, on a free port (8080 may be another user's)",
    ),
    Substitution(
        r"--source 0\b", "--source synthetic:320x240@30 --frames 30", "no camera here: the synthetic source"
    ),
    Substitution(
        r"rtsp://cam\.local/stream1 (.*)--duration 60\b",
        r"{rtsp_url} \1--duration 5",
        "a real RTSP camera on loopback (tests/rtsp_server.py), for 5 s rather than 60",
    ),
    Substitution(r"mqtt://broker\.local\b", "mqtt://127.0.0.1:{mqtt_port}", "the test's own Mosquitto"),
    Substitution(r"mqtt://127\.0\.0\.1:1883\b", "mqtt://127.0.0.1:{mqtt_port}", "the test's own Mosquitto"),
    Substitution(
        r"--host edge@cam-7",
        "{ssh_args}",
        "the device is this machine behind a real sshd on loopback, its state root a temp folder",
    ),
    Substitution(
        r"^(edgekit deploy --device \S+ --bundle .*)$",
        r"\1 --budget 2000",
        "the device runs at a relaxed budget: a busy test machine's p99 is no promise about a device's"
        " (the budget gate has its own tests, tests/test_deploy_install.py)",
    ),
    Substitution(
        r"> /etc/systemd/system/(\S+)$",
        r"> \1",
        "into the folder, not root's /etc; tests/test_deploy_install.py checks what the unit says",
    ),
    Substitution(r"(edgekit fleet serve .*)$", r"\1 --port {http_port}", "port 8765 may be another user's"),
    Substitution(
        r"^(edgekit serve bundles/enl0-x86(?: --trace --device-id cam-7)?)$",
        r"\1 --http-port {http_port} --grpc-port 0",
        "ports 8000 and 8001 may be another user's",
    ),
    Substitution(r"builder\.pub\.pem", "~/.config/edgekit/keys/edgekit.pub.pem", "the key made above"),
    Substitution(r"\bBUNDLE\b", "bundles/enl0-x86", "a placeholder: the bundle built above"),
]

#: Commands that serve until stopped, by a pattern: the URL that must answer while they run (or None).
LONG_RUNNING = {
    r"^edgekit fleet serve ": "http://127.0.0.1:{http_port}/",
    r"^edgekit serve ": "http://127.0.0.1:{http_port}/v2/health/ready",
    r"^\S*edgekit fleet simulate ": None,
    r"^edgekit telemetry tail ": None,
    r"--preview ": "http://127.0.0.1:{http_port}/",
}
#: The guides repeat the README's commands for a reader who starts there.  Run a second time in the
#: same folder these refuse (``keys generate`` never overwrites a key) or redo the same work (a
#: build of the same bundle), so each runs once; a repeated deploy runs again (a rollback needs two).
ONCE = r"^edgekit (keys generate$|build )"
#: Commands that print what the docs show under another, skipped, command of their block.
PRINTS_AS = {
    "edgekit build --onnx yolov8n.onnx --device x86_64-cpu --write-card models/my-yolo": (
        "edgekit build --onnx yolov8n.onnx --device x86_64-cpu -o bundles/yolo-x86"
    ),
}
#: What a command's output must hold where the docs say what it does.
SHOWS = {
    "edgekit keys generate": ".config/edgekit/keys/edgekit.pem",
    "edgekit --version": "edgekit",
    "edgekit devices list": "my-board",
}


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    text: str  # as written: continuations joined, comment and prompt dropped
    shown: tuple[str, ...] = ()  # what the docs show it print: the ``# lines`` right after it


def shell_blocks() -> list[tuple[str, list[Command]]]:
    """``(where, commands)`` for every shell block of the docs, ``where`` being ``file:line``."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            first = text.count("\n", 0, m.start(2)) + 1
            name = doc.relative_to(ROOT)
            found.append((f"{name}:{first - 1}", _commands(m.group(1), m.group(2), name, first)))
    return found


def _commands(lang: str, body: str, name: Path, first: int) -> list[Command]:
    commands: list[Command] = []
    pending = ""
    start = first
    lines = body.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        if lang == "console":
            if not line.startswith("$ ") and not pending:
                continue  # the command's output
            line = line.removeprefix("$ ")
        if not pending:
            start = first + i
        # A comment line right under a command (no blank line between) is what the command printed.
        if line.startswith("# ") and commands and not pending and lines[i - 1].strip():
            last = commands[-1]
            commands[-1] = Command(last.where, last.text, (*last.shown, line[2:]))
            continue
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # no command here quotes a '#'
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            commands.append(Command(f"{name}:{start}", " ".join(text.split())))
    return commands


def substituted(text: str) -> tuple[str, list[str]]:
    """The command with every substitution that applies, and why each did (placeholders left in)."""
    whys = []
    for s in SUBSTITUTIONS:
        new = re.sub(s.pattern, s.replacement, text)
        if new != text:
            whys.append(s.why)
            text = new
    return text, whys


def _blocks_to_run() -> list[Any]:
    params = []
    for where, cmds in shell_blocks():
        if not cmds or all(c.text in SKIPPED for c in cmds):
            continue
        heavy = any(
            re.search(r"edgekit (build|demo|deploy)\b", c.text) and c.text not in SKIPPED for c in cmds
        )
        params.append(pytest.param(where, cmds, id=where, marks=[pytest.mark.slow] if heavy else []))
    return params


def test_every_command_is_run_substituted_or_skipped_with_a_reason() -> None:
    every = [c for _, cmds in shell_blocks() for c in cmds]
    # So that moving the docs cannot leave this test checking nothing.
    assert any(c.text.startswith("edgekit build --model models/efficientnet-lite0") for c in every)
    assert sum(c.text not in SKIPPED for c in every) >= 20
    stale = [k for k in SKIPPED if all(c.text != k for c in every)]
    assert not stale, f"SKIPPED entries that match no command (the docs changed?): {stale}"
    run = [c for c in every if c.text not in SKIPPED]
    unused = [s.pattern for s in SUBSTITUTIONS if not any(re.search(s.pattern, c.text) for c in run)]
    assert not unused, f"SUBSTITUTIONS that apply to no command: {unused}"


def test_the_parser_joins_continuations_and_drops_comments_prompts_and_output() -> None:
    body = (
        "$ edgekit build --model m \\\n    --device x86   # why\nshown output\n# a note\n$ edgekit doctor\n"
    )
    assert _commands("console", body, Path("doc.md"), 10) == [
        Command("doc.md:10", "edgekit build --model m --device x86"),
        Command("doc.md:14", "edgekit doctor"),
    ]
    body = "edgekit a  # x\n# it prints\n\n# a note\nedgekit b [--json]\n"
    assert _commands("bash", body, Path("d"), 1) == [
        Command("d:1", "edgekit a", ("it prints",)),
        Command("d:5", "edgekit b [--json]"),
    ]


@dataclass
class Folder:
    path: Path
    env: dict[str, str]
    mqtt_port: int
    http_port: int
    ssh_args: str
    rtsp_url: str = ""  # the camera's, once a block that reads it has started it
    done: set[str] = field(default_factory=set)

    def fill(self, text: str) -> str:
        values = {
            "mqtt_port": self.mqtt_port,
            "http_port": self.free_http(),
            "ssh_args": self.ssh_args,
            "rtsp_url": self.rtsp_url,
        }
        # Only these placeholders, not str.format: a command may hold braces of its own (a trace
        # UI's URL template, '.../trace/{trace_id}').
        return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m[1], m[0])), text)

    def free_http(self) -> int:
        self.http_port = free_port()
        return self.http_port


@pytest.fixture(scope="module")
def folder(
    tmp_path_factory: pytest.TempPathFactory,
    cache_env: dict[str, str],
    x86_bundle: tuple[Path, dict[str, Any]],
) -> Iterator[Folder]:
    """The reader's working folder: a fresh HOME, the checkout's files, a broker and an sshd "device"."""
    del x86_bundle  # built first, so the README's build of the same model finds its steps cached
    home = tmp_path_factory.mktemp("home")
    work = tmp_path_factory.mktemp("work")
    for name in ("models", "devices", "tools"):  # what is in them, not they: commands write models/my-yolo
        (work / name).mkdir()
        for entry in (ROOT / name).iterdir():
            (work / name / entry.name).symlink_to(entry)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {k: v for k, v in cache_env.items() if k not in ("EDGEKIT_TRUST", "XDG_CONFIG_HOME")}
    env |= {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        # The cache's seal stays this user's (a cache kept in EDGEKIT_TEST_CACHE was sealed by it).
        "EDGEKIT_CACHE_KEY_FILE": env.get("EDGEKIT_CACHE_KEY_FILE") or str(config_root() / "cache.key"),
        "EDGEKIT_AGENT_ROOT": str(home / "agent"),  # `edgekit agent status` on "this device"
        "EDGEKIT_STATE": str(home / "state"),
        "COLUMNS": "200",
    }
    _readers_files(work)
    broker = Mosquitto(tmp_path_factory.mktemp("mqtt")).start()
    sshd = Sshd(tmp_path_factory.mktemp("sshd")).start()
    device = home / "device root"
    remote = Path(sys.executable).parent / "edgekit"
    ssh_args = " ".join(
        [
            *map(shlex.quote, sshd.client_args()),
            "--root",
            shlex.quote(str(device)),
            "--remote-edgekit",
            shlex.quote(str(remote)),
        ]
    )
    try:
        yield Folder(work, env, broker.port, 0, ssh_args)
    finally:
        sshd.stop()
        broker.stop()


@pytest.fixture(scope="module")
def rtsp_camera() -> Iterator[RtspCamera]:
    """The network camera run.md reads: gst-rtsp-server on loopback (skipped where it cannot run)."""
    if missing := rtsp_server_missing():
        pytest.skip(f"no RTSP camera here: {missing}")
    with RtspCamera() as cam:
        yield cam


@pytest.mark.parametrize(("where", "commands"), _blocks_to_run())
def test_the_block_runs_as_written(
    where: str, commands: list[Command], folder: Folder, request: pytest.FixtureRequest
) -> None:
    if any("{rtsp_url}" in substituted(c.text)[0] for c in commands if c.text not in SKIPPED):
        folder.rtsp_url = request.getfixturevalue("rtsp_camera").url  # started for the blocks that read it
    for c in commands:
        if c.text in SKIPPED:
            continue
        text, _ = substituted(c.text)
        if text in folder.done and re.match(ONCE, text):
            continue
        folder.done.add(text)
        began = time.monotonic()
        text = folder.fill(text)
        if "--host edge@cam-7" in c.text:
            _trust_on_the_device(folder)
        serving = next((url for p, url in LONG_RUNNING.items() if re.search(p, text)), "none")
        if serving != "none":
            _serves(c, text, folder, serving.format(http_port=folder.http_port) if serving else None)
            continue
        if m := re.fullmatch(r"export (\w+)=(\S+)", text):
            # Later commands of the block see it, as in the reader's shell (each runs in its own bash).
            folder.env[m[1]] = _expanded(m[2], folder)
            continue
        r = subprocess.run(
            ["bash", "-c", text], capture_output=True, text=True, env=folder.env, cwd=folder.path, timeout=600
        )
        assert r.returncode == 0, f"{c.where}: {c.text}\nran: {text}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        print(f"{time.monotonic() - began:6.1f} s  {c.where}: {text}")
        printed = r.stdout + r.stderr
        shown = [*c.shown, *([SHOWS[c.text]] if c.text in SHOWS else [])]
        shown += next((s.shown for s in commands if s.text == PRINTS_AS.get(c.text)), ())
        missing = [line for line in shown if line not in printed]
        assert not missing, f"{c.where}: {c.text}\nthe docs show {missing}; it printed\n{printed[-3000:]}"
        if re.match(r"edgekit run .*--json", text):
            # A run reports in JSON even when no frame came (the human form refuses that), so count them.
            assert json.loads(r.stdout)["frames"] > 0, (
                f"{c.where}: {c.text}\nran: {text}\nno frame: {r.stdout}"
            )


def _expanded(word: str, folder: Folder) -> str:
    r = subprocess.run(
        ["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, env=folder.env, check=True
    )
    return r.stdout


def _readers_files(work: Path) -> None:
    """What the guides read that is the reader's own: ``clip.mp4`` (one second), ``photos/``, ``run.toml``."""
    import cv2
    from skimage import data

    photos = [cv2.cvtColor(getattr(data, n)(), cv2.COLOR_RGB2BGR) for n in ("astronaut", "chelsea", "coffee")]
    (work / "photos").mkdir()
    for i, image in enumerate(photos):
        cv2.imwrite(str(work / "photos" / f"{i}.jpg"), image)
    _yolov8n_stand_in(work / "yolov8n.onnx")
    # run.toml is the events guide's, as written there (its first toml block).
    guide = (ROOT / "docs" / "guides" / "events.md").read_text()
    toml = re.search(r"^```toml\n(.*?)^```", guide, re.DOTALL | re.MULTILINE)
    assert toml is not None, "docs/guides/events.md lost its run.toml block"
    (work / "run.toml").write_text(toml.group(1))
    writer = cv2.VideoWriter(str(work / "clip.mp4"), cv2.VideoWriter.fourcc(*"mp4v"), 30.0, (320, 240))
    assert writer.isOpened()
    for i in range(30):
        writer.write(cv2.resize(photos[i // 10], (320, 240)))
    writer.release()


def _yolov8n_stand_in(path: Path) -> None:
    """An ONNX file that says what YOLOv8n's export says: its metadata, its input and its head's shape."""
    from test_file_card import _graph

    names = [
        "person",
        "bicycle",
        "car",
        "motorcycle",
        "airplane",
        "bus",
        *(f"class{i}" for i in range(6, 80)),
    ]
    meta = {
        "author": "Ultralytics",
        "task": "detect",
        "names": str(dict(enumerate(names))),
        "imgsz": "[640, 640]",
    }
    _graph(path, (1, 84, 8400), meta, in_shape=(1, 3, 640, 640))


def _trust_on_the_device(folder: Folder) -> None:
    """deploy.md's "on the device, once": the device trusts the key the bundles are signed with."""
    key = Path(folder.env["HOME"]) / ".config/edgekit/keys/edgekit.pub.pem"
    root = Path(folder.env["HOME"]) / "device root"
    r = subprocess.run(
        ["edgekit", "agent", "trust", str(key), "--root", str(root)],
        capture_output=True,
        text=True,
        env=folder.env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def _serves(c: Command, text: str, folder: Folder, url: str | None) -> None:
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {text}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=folder.env,
        cwd=folder.path,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        answered = url is None
        while time.monotonic() < deadline and proc.poll() is None:
            if url is None:
                time.sleep(3)  # long enough to fail on a bad option or an unreachable broker
                break
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    answered = resp.status == 200
                    break
            except OSError:
                time.sleep(0.2)
        alive = proc.poll() is None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert alive and answered, (
        f"{c.where}: {c.text}\nran: {text}\nexit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    )
