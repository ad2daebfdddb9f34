"""Deploy and rollback over SSH: the device's own ``edgekit agent`` run remotely, its verdict read back.

``deploy_over_ssh`` checks the remote edgekit, copies the archive (``edgekit.deploy.ssh``),
runs ``edgekit agent install ... --json`` there (its JSON progress lines are read as they
come) and removes the copy; ``rollback_over_ssh`` runs ``edgekit agent rollback``.  Nothing
the device prints is evaluated, only parsed as JSON.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekit.deploy.ssh import (
    DEFAULT_ROOT,
    REMOTE_ARCHIVE,
    SSH_FAILED,
    Progress,
    SshError,
    SshProcess,
    SshTarget,
    check_remote,
    copy_archive,
    explain_ssh_failure,
    remote_error,
    remove_remote,
)
from edgekit.errors import DeployError
from edgekit.protocol.control import check_deploy_id, new_deploy_id


def parse_agent_output(stdout_lines: Sequence[str]) -> dict[str, Any] | None:
    """The agent's result from its ``--json`` output: a ``{"result": ...}`` line, or one JSON document."""
    for line in reversed(stdout_lines):
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
                return dict(doc["result"])
    with contextlib.suppress(ValueError):
        doc = json.loads("".join(stdout_lines))
        if isinstance(doc, dict):
            inner = doc.get("result")
            return dict(inner) if isinstance(inner, dict) else doc
    return None


def run_remote_agent(
    target: SshTarget, args: Sequence[str], doing: str, progress: Progress | None = None, cleanup: str = ""
) -> tuple[int, dict[str, Any] | None, str]:
    """Run ``<remote edgekit> agent ARGS`` and pass each JSON ``{"step": ...}`` line to ``progress``.

    ``cleanup`` is a shell command run on the device after the agent, whatever its outcome.
    Returns (the agent's exit code, its result, its stderr).  Lines that are not JSON
    objects are logged and skipped: the device's output is data, never code.
    """
    agent = f"{target.remote_edgekit_words()} agent {shlex.join(args)}"
    script = f"{agent}; rc=$?; {cleanup}; exit $rc" if cleanup else agent
    ssh = SshProcess(target, script, subprocess.DEVNULL)
    kept: list[str] = []
    try:
        for raw in ssh.lines():
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            kept.append(line)
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # part of a multi-line document, or noise; parse_agent_output sorts it out
            if isinstance(doc, dict) and isinstance(doc.get("step"), str) and progress is not None:
                progress(doc["step"], {k: v for k, v in doc.items() if k != "step"})
        code, rest, err = ssh.finish()
    finally:
        ssh.kill()
    kept += [ln for ln in rest.splitlines() if ln.strip()]
    if code == SSH_FAILED:
        raise explain_ssh_failure(target, err, doing)
    return code, parse_agent_output(kept), err


@dataclass
class SshOutcome:
    """What a deploy or rollback over SSH came to: the agent's result and where it ran."""

    host: str
    deploy_id: str
    result: dict[str, Any]
    remote_version: str = ""
    seconds: float = 0.0
    copied_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the agent reported success."""
        return bool(self.result.get("ok"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "deploy_id": self.deploy_id,
            "ok": self.ok,
            "remote_edgekit": self.remote_version,
            "seconds": round(self.seconds, 3),
            "copied_bytes": self.copied_bytes,
            "result": self.result,
            **self.extra,
        }


def _judge(
    target: SshTarget, code: int, result: dict[str, Any] | None, err: str, what: str
) -> dict[str, Any]:
    """The agent's result when it gave one (ok or a failed step: exit 0 or 1), else ``SshError``."""
    if code in (0, 1) and result is not None:
        return result
    if code in (126, 127):
        raise SshError(
            f"edgekit is no longer runnable on {target.host}", "check --remote-edgekit", "remote-edgekit"
        )
    error, hint = remote_error(err)
    if "no such command" in err.lower() and "agent" in err.lower():
        hint = "the device's edgekit is too old for `edgekit agent`: upgrade it there"
    raise SshError(
        f"{what} on {target.host} failed (exit {code}): {error or 'no result from the agent'}",
        hint or "run the same `edgekit agent` command on the device to see its full output",
        "remote",
    )


def deploy_over_ssh(
    target: SshTarget,
    bundle: Path,
    *,
    root: str = DEFAULT_ROOT,
    deploy_id: str | None = None,
    profile: str | None = None,
    progress: Progress | None = None,
    budget_ms: float | None = None,
) -> SshOutcome:
    """Copy ``bundle`` (a folder or ``.tar.gz``) to ``target`` and install it with the device's agent.

    Raises ``SshError`` when the bundle never reached the agent (host key, login, copy, no
    edgekit there).  Otherwise returns the agent's verdict: ``outcome.ok`` is False when it
    refused the bundle (``result["step"]`` and ``result["reason"]`` say where and why), and
    the device keeps running what it ran before.
    """
    from edgekit.bundle.archive import is_archive_name, pack

    started = time.monotonic()
    deploy_id = check_deploy_id(deploy_id or new_deploy_id("ssh"))
    report = progress or (lambda step, info: None)
    version = check_remote(target)
    report("check", {"host": target.host, "remote_edgekit": version})
    with tempfile.TemporaryDirectory(prefix="edgekit-deploy-") as tmp:
        if bundle.is_dir():
            report("pack", {"bundle": str(bundle)})
            archive = pack(bundle, Path(tmp) / REMOTE_ARCHIVE)
        elif is_archive_name(bundle) and bundle.is_file():
            archive = bundle
        else:
            raise DeployError(
                f"{bundle} is neither a bundle folder nor a .tar.gz", "pass what edgekit build wrote"
            )
        size = archive.stat().st_size
        remote_file = copy_archive(target, archive, report)
    args = [remote_file, "--root", root, "--id", deploy_id, "--json"]
    if profile:
        args += ["--device", profile]
    if budget_ms is not None:  # the device runs at its own budget: the gate holds p99 to that
        args += ["--budget", f"{budget_ms:g}"]
    folder = remote_file.rsplit("/", 1)[0]
    finished = False
    try:
        code, result, err = run_remote_agent(
            target, ["install", *args], "installing", progress, cleanup=f"rm -rf -- {shlex.quote(folder)}"
        )
        finished = True
    finally:
        if not finished:  # interrupted or the link dropped: the script's own cleanup may not have run
            remove_remote(target, remote_file)
    result = _judge(target, code, result, err, "the install")
    return SshOutcome(target.host, deploy_id, result, version, time.monotonic() - started, size)


def rollback_over_ssh(
    target: SshTarget,
    *,
    root: str = DEFAULT_ROOT,
    deploy_id: str | None = None,
    progress: Progress | None = None,
) -> SshOutcome:
    """Run ``edgekit agent rollback`` on ``target``: the other complete slot becomes active again."""
    started = time.monotonic()
    deploy_id = check_deploy_id(deploy_id or new_deploy_id("ssh"))
    version = check_remote(target)
    if progress is not None:
        progress("check", {"host": target.host, "remote_edgekit": version})
    code, result, err = run_remote_agent(
        target, ["rollback", "--root", root, "--id", deploy_id, "--json"], "rolling back", progress
    )
    result = _judge(target, code, result, err, "the rollback")
    return SshOutcome(target.host, deploy_id, result, version, time.monotonic() - started)
