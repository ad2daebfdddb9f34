"""An agent downloads from ``edgekit fleet serve --artifacts-port`` with its download token, and only then.

Real Mosquitto, the real ``edgekit fleet serve`` with a download token on its artifact port,
real ``edgekit agent run`` processes (``test_deploy_fleet_identity``'s site).  The archive is
named as a rollout names it (``name_artifact``, what ``edgekit deploy --fleet`` calls); it is not a
bundle, so an agent that fetched it stops at the install's first check: what is tested is the
download.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_deploy_fleet_identity import Site, site  # noqa: F401 - the fixture
from test_deploy_mqtt import wait_for

from edgekit.testing.mosquitto import free_port
from edgekit.testing.process import stop_process

from conftest import EDGEKIT, ROOT

DOWNLOAD_TOKEN = "agents-d0wnload-token-0123456789"


def test_an_agent_fetches_a_named_archive_with_the_download_token_and_not_without(site: Site) -> None:  # noqa: F811
    from edgekit.fleet.artifacts import name_artifact

    folder = site.work / "artifacts"
    folder.mkdir()
    blob = os.urandom(5000)
    (folder / "b-1.tar.gz").write_bytes(blob)
    sha = hashlib.sha256(blob).hexdigest()
    name_artifact(folder, "b-1.tar.gz", sha, len(blob))
    token_file = site.work / "artifact.token"
    token_file.write_text(DOWNLOAD_TOKEN)
    token_file.chmod(0o600)
    port, bundles_port = free_port(), free_port()
    env = {k: v for k, v in site.env.items() if not k.endswith(("_FLEET_TOKEN", "_ARTIFACT_TOKEN"))}
    log = site.work / "serve.log"
    server = subprocess.Popen(
        [*EDGEKIT, "fleet", "serve", "--mqtt", site.broker.url, "--db", str(site.work / "fleet.db"),
         "--port", str(port), "--artifacts", str(folder), "--artifacts-port", str(bundles_port),
         "--artifact-token-file", str(token_file)],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    origin = f"http://127.0.0.1:{bundles_port}"
    url = f"{origin}/artifacts/b-1.tar.gz"

    def answers_401() -> bool:
        try:
            urllib.request.urlopen(url, timeout=2).close()
        except urllib.error.HTTPError as err:
            return err.code == 401
        except OSError:
            return False
        return False

    try:
        assert wait_for(answers_401, 60), log.read_text()
        holder = site.agent("prod", "cam-8", "--artifact-token-file", str(token_file), origin=origin)
        without = site.agent("prod", "cam-9", origin=origin)
        for agent in (holder, without):

            def online(device: str = agent.device) -> bool:
                return site.watcher.online("prod", device)

            assert wait_for(online, 60), agent.log.read_text()[-2000:]

        def deploy(device: str, deploy_id: str) -> dict[str, object]:
            site.watcher.publish("prod", device, site.command("prod", device, deploy_id, url=url, sha256=sha,
                                                             size=len(blob)))  # fmt: skip
            got: list[tuple[str, dict[str, object]]] = wait_for(lambda: site.watcher.answers(deploy_id), 60)
            assert got, (holder.log.read_text() + without.log.read_text())[-3000:]
            return got[0][1]

        got = deploy("cam-9", "no-token")
        assert got["ok"] is False and got["step"] == "download" and got["reason"] == "download failed", got
        assert "401" in without.log.read_text()  # the agent's own log says why; the answer does not
        got = deploy("cam-8", "with-token")
        # Fetched and checked against the command's SHA-256; then refused as a bundle (it is none).
        assert got["ok"] is False and got["step"] not in ("download", "command"), got
        assert DOWNLOAD_TOKEN not in holder.log.read_text()
    finally:
        stop_process(server, grace_s=15, sig=signal.SIGINT)


def test_publishing_an_archive_names_it(tmp_path: Path, x86_bundle: tuple[Path, dict[str, object]]) -> None:
    from edgekit.deploy.publish import publish_artifact
    from edgekit.fleet.artifacts import artifact_path, named_artifacts

    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "fleet.token").write_text("x" * 32)
    artifact = publish_artifact(x86_bundle[0], folder, "http://fleet.local:8766/artifacts")
    named = named_artifacts(folder)
    assert list(named) == [artifact.name] and named[artifact.name]["sha256"] == artifact.sha256
    assert artifact_path(folder, artifact.name) == artifact.path
    assert artifact_path(folder, "fleet.token") is None
    # Replaced under its name by other bytes: no longer what was named, not served.
    artifact.path.write_bytes(b"other")
    assert artifact_path(folder, artifact.name) is None


def test_the_pipeline_child_does_not_get_the_download_token(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.deploy.supervisor import child_environment

    monkeypatch.setenv("EDGEKIT_ARTIFACT_TOKEN", DOWNLOAD_TOKEN)
    assert "EDGEKIT_ARTIFACT_TOKEN" not in child_environment(None, None)
