"""The device side of a deploy with the real x86 bundle and real runtimes: install into A/B slots,
the health gate (a re-signed bundle with a scrambled int8 artifact must fail it), every kind of bad
input refused with the right step, replayed ids, rollback, and recovery from a damaged state root."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from deploy_bundles import (
    CI_BUDGET_MS,
    absolute_path_archive,
    bad_signature_bundle,
    broken_int8_bundle,
    ci_bundle,
    hash_mismatch_bundle,
    resign,
    slim_bundle,
    symlink_out_archive,
    tar_slip_archive,
    truncated_archive,
    unknown_key_bundle,
)

import edgekit
from edgekit.bundle import pack, read_manifest, verify
from edgekit.bundle.manifest import parse_manifest
from edgekit.core.stats import TIE_MARGIN
from edgekit.deploy import STEPS, StateRoot, install, recover, rollback

from conftest import EDGEKIT, ROOT

PROFILE = "x86_64-cpu"
RUNS = 30  # timed health-gate frames per install (the default is 101): the numbers, quicker


@dataclass(frozen=True)
class Bundles:
    built: Path  # the x86 bundle as `edgekit build` wrote it
    v1: Path  # that bundle with the CI budget (deploy_bundles.CI_BUDGET_MS), re-signed, packed
    v1_dir: Path
    v2: Path  # a slimmer re-signed "version 2" (ONNX Runtime artifacts only), packed
    broken: Path  # int8 scrambled, re-signed, packed
    public_key: Path
    private_key: Path
    work: Path


@pytest.fixture(scope="module")
def bundles(
    x86_bundle: tuple[Path, dict[str, Any]], keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Bundles:
    folder, _ = x86_bundle
    work = tmp_path_factory.mktemp("deploy")
    v1 = ci_bundle(folder, work / "v1", keys[0])
    v2 = slim_bundle(folder, work / "v2", keys[0], version="2.0-test")
    broken = broken_int8_bundle(folder, work / "broken", keys[0])
    return Bundles(
        built=folder,
        v1=pack(v1, work / "v1.tar.gz"),
        v1_dir=v1,
        v2=pack(v2, work / "v2.tar.gz"),
        broken=pack(broken, work / "broken.tar.gz"),
        public_key=keys[1],
        private_key=keys[0],
        work=work,
    )


def _trusting(path: Path, key: Path) -> StateRoot:
    root = StateRoot(path)
    shutil.copy(key, root.keys_dir / "builder.pub.pem")
    return root


@pytest.fixture(scope="module")
def installed_template(bundles: Bundles, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state root with v1 installed and active (copied for each test that starts from there)."""
    root = _trusting(tmp_path_factory.mktemp("template") / "root", bundles.public_key)
    result = install(root, bundles.v1, "first", PROFILE, health_runs=RUNS)
    assert result.ok, result
    return root.path


@pytest.fixture
def installed(installed_template: Path, tmp_path: Path) -> StateRoot:
    dest = tmp_path / "root"
    shutil.copytree(installed_template, dest, symlinks=True)
    return StateRoot(dest)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EDGEKIT, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def frames(bundle: Path) -> list[tuple[np.ndarray, int]]:
    m = read_manifest(bundle)
    assert m.eval_set is not None
    out = []
    for f in m.eval_set.frames:
        image = cv2.imdecode(np.frombuffer((bundle / f.path).read_bytes(), np.uint8), cv2.IMREAD_COLOR)
        assert image is not None, f.path
        out.append((image, f.top1))
    return out


def assert_untouched(root: StateRoot, public_key: Path, version: str | None = None) -> None:
    """The active slot is still slot a, complete, verifying; slot b holds nothing that looks valid."""
    assert root.active() == "a"
    active = root.active_bundle()
    assert active is not None and verify(active, [public_key], require_signature=True).ok
    if version is not None:
        assert read_manifest(active).model.version == version
    assert root.slot_info("b") is None
    assert not (root.slot_dir("b") / "slot.json").exists()
    leftovers = [p.name for p in root.slot_dir("b").iterdir()]
    assert leftovers == [], leftovers  # a refused bundle is cleaned away, not left half-written


# -- eval frames -------------------------------------------------------------------------


def test_bundle_carries_eval_frames_with_the_fp32_reference(bundles: Bundles) -> None:
    m = read_manifest(bundles.built)
    assert m.eval_set is not None and m.eval_set.reference == "onnxruntime-fp32"
    assert 4 <= len(m.eval_set.frames) <= 16
    total = sum(f.size for f in m.eval_set.frames)
    assert total < 600_000, total  # a few small JPEGs, not a data set
    for f in m.eval_set.frames:
        assert f.path.startswith("eval/") and (bundles.built / f.path).read_bytes()[:2] == b"\xff\xd8"
        assert 0 <= f.top1 < len(m.labels) and f.margin >= TIE_MARGIN
    assert verify(bundles.built, [bundles.public_key], require_signature=True).ok
    # The reference is what fp32 says about the stored bytes, through the device's own frame path.
    with edgekit.load(bundles.built, device=PROFILE) as model:
        assert (model.backend, model.candidate) == ("onnxruntime", "onnxruntime-fp32")
        for image, top1 in frames(bundles.built):
            assert int(np.argmax(model.infer(image))) == top1


def test_eval_frames_are_covered_by_verify_and_optional_in_old_manifests(
    bundles: Bundles, tmp_path: Path
) -> None:
    copy = tmp_path / "b"
    shutil.copytree(bundles.v1_dir, copy)
    victim = next((copy / "eval").iterdir())
    victim.write_bytes(victim.read_bytes()[:-10])
    report = verify(copy, [bundles.public_key], require_signature=True)
    assert not report.ok and any(c.name == f"eval/{victim.name}" for c in report.failures)
    (copy / "eval" / "extra.jpg").write_bytes(b"x")
    assert any("extra.jpg" in c.detail for c in verify(copy).failures)
    doc = json.loads((bundles.v1_dir / "manifest.json").read_bytes())
    del doc["eval_set"]
    assert parse_manifest(json.dumps(doc).encode()).eval_set is None


# -- install -----------------------------------------------------------------------------


def test_cli_install_activates_the_bundle_and_it_classifies(bundles: Bundles, tmp_path: Path) -> None:
    root = tmp_path / "root"
    r = cli("agent", "trust", str(bundles.public_key), "--root", str(root))
    assert r.returncode == 0, r.stderr
    r = cli(
        "agent", "install", str(bundles.v1), "--root", str(root), "--id", "one", "--device", PROFILE, "--json"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = json_lines(r.stdout)  # every stdout line is JSON, even with runtimes loading
    assert [d["step"] for d in lines[:-1]] == list(STEPS)
    result = lines[-1]["result"]
    assert result["ok"] and result["step"] == "done" and result["slot"] == "a" and not result["replayed"]
    health = result["health"]
    assert (health["backend"], health["precision"]) == ("onnxruntime", "fp32")
    assert health["frames"] == len(frames(bundles.v1_dir)) and health["top1_agreement"] == 1.0
    assert 0 < health["p50_ms"] <= health["p99_ms"] <= health["budget_ms"] == CI_BUDGET_MS
    print(f"\ninstall {result['elapsed_s']} s; health {json.dumps(health)}")

    status = json.loads(cli("agent", "status", "--root", str(root), "--json").stdout)
    assert status["active"] == "a" and status["deploy_id"] == "one"
    assert status["version"] == read_manifest(bundles.v1_dir).model.version
    assert status["last"]["ok"] and status["last"]["health"]["p99_ms"] == health["p99_ms"]
    assert status["slots"]["b"]["complete"] is False
    text = cli("agent", "status", "--root", str(root))
    assert text.returncode == 0 and "slot a" in text.stdout and "p99" in text.stdout

    active = StateRoot(root).active_bundle()
    assert active is not None and active == (root / "slots" / "a" / "bundle").absolute()
    with edgekit.load(active, device=PROFILE) as model:
        image, top1 = frames(active)[0]
        assert model.classify(image, k=1)[0].id == top1


def test_broken_int8_fails_the_health_gate_and_the_first_version_stays(
    installed: StateRoot, bundles: Bundles
) -> None:
    # Signature and hashes are fine (re-signed with the trusted key): only the health gate can tell.
    assert verify(bundles.broken, [bundles.public_key], require_signature=True).ok
    seen: list[str] = []
    result = install(
        installed, bundles.broken, "broken", PROFILE, lambda s, _: seen.append(s), health_runs=RUNS
    )
    assert not result.ok and result.step == "health" and seen == list(STEPS[:4])
    assert result.health is not None
    # The x86 profile's selection ran the scrambled int8 artifact, and it disagreed with fp32.
    assert (result.health["backend"], result.health["precision"]) == ("onnxruntime", "int8")
    assert result.health["top1_agreement"] < 0.98 and "top-1" in result.reason
    assert result.active == "a"
    assert_untouched(installed, bundles.public_key, read_manifest(bundles.v1_dir).model.version)
    state = installed.last_state()
    assert state is not None and state["deploy_id"] == "broken" and state["step"] == "health"
    with edgekit.load(installed.active_bundle(), device=PROFILE) as model:  # type: ignore[arg-type]
        image, top1 = frames(bundles.v1_dir)[1]
        assert int(np.argmax(model.infer(image))) == top1


def test_a_bundle_over_its_budget_fails_the_health_gate(installed: StateRoot, bundles: Bundles) -> None:
    slow = resign(
        bundles.v1_dir, bundles.work / "tight", bundles.private_key, budget_ms=0.01, version="tight"
    )
    result = install(installed, slow, "tight", PROFILE, health_runs=RUNS)
    assert not result.ok and result.step == "health" and "over the budget of 0.01 ms" in result.reason
    assert result.health is not None and result.health["top1_agreement"] == 1.0  # only the budget failed
    assert_untouched(installed, bundles.public_key)
    # A device that runs at a looser budget of its own (agent --budget) holds the gate to that one.
    loose = install(installed, slow, "tight-but-device-budget", PROFILE, health_runs=RUNS, budget_ms=60_000)
    assert loose.ok and loose.health is not None and loose.health["budget_ms"] == 60_000
    assert installed.status()["version"] == "tight" == loose.version


def test_second_install_goes_to_the_other_slot_then_rollback(installed: StateRoot, bundles: Bundles) -> None:
    result = install(installed, bundles.v2, "two", PROFILE, health_runs=RUNS)
    assert result.ok and result.slot == "b" and installed.active() == "b" and result.version == "2.0-test"
    assert installed.slot_info("a") is not None  # the previous version stays for rollback
    back = rollback(installed, "back")
    assert back.ok and back.action == "rollback" and installed.active() == "a"
    assert back.version == read_manifest(bundles.v1_dir).model.version
    forward = rollback(installed, "forward")  # rollback switches to the other complete slot
    assert forward.ok and installed.active() == "b"
    again = rollback(installed, "back")  # a replayed id changes nothing
    assert again.replayed and again.ok and installed.active() == "b"


def test_rollback_with_nothing_to_go_back_to(installed: StateRoot, tmp_path: Path) -> None:
    result = rollback(installed, "nope")
    assert not result.ok and result.step == "verify" and "nothing to roll back" in result.reason
    assert installed.active() == "a"
    empty = StateRoot(tmp_path / "empty")
    assert not rollback(empty, "x").ok and empty.active() is None
    r = cli("agent", "rollback", "--root", str(installed.path), "--id", "nope2", "--json")
    assert r.returncode == 1 and json_lines(r.stdout)[-1]["result"]["step"] == "verify"


def test_replayed_deploy_id_returns_the_record_and_installs_nothing(
    installed: StateRoot, bundles: Bundles
) -> None:
    marker = installed.slot_dir("a") / "slot.json"
    before = marker.stat().st_mtime_ns
    seen: list[str] = []
    again = install(installed, bundles.v2, "first", PROFILE, lambda s, _: seen.append(s))
    assert again.replayed and again.ok and again.slot == "a" and seen == []
    assert installed.active() == "a" and installed.slot_info("b") is None
    assert marker.stat().st_mtime_ns == before
    failed = install(installed, bundles.broken, "bad-once", PROFILE, health_runs=RUNS)
    assert not failed.ok and not failed.replayed
    replay = install(installed, bundles.broken, "bad-once", PROFILE, lambda s, _: seen.append(s))
    assert replay.replayed and not replay.ok and replay.step == "health" and seen == []
    assert replay.health == failed.health


def test_replay_after_a_kill_between_switch_and_record(installed: StateRoot, bundles: Bundles) -> None:
    (installed.deploys_dir / "first.json").unlink()  # as if killed right after the switch
    replay = install(installed, bundles.v2, "first", PROFILE)
    assert replay.replayed and replay.ok and installed.active() == "a" and installed.slot_info("b") is None


# -- bad input ---------------------------------------------------------------------------

Maker = Callable[[Bundles, Path], Path]


def _unsigned(b: Bundles, d: Path) -> Path:
    out = d / "unsigned"
    shutil.copytree(b.v1_dir, out)
    (out / "manifest.sig").unlink()
    doc = json.loads((out / "manifest.json").read_bytes())
    doc["signature"] = None
    (out / "manifest.json").write_text(json.dumps(doc))
    return pack(out, d / "unsigned.tar.gz")


def _unknown_key(b: Bundles, d: Path) -> Path:
    return pack(unknown_key_bundle(b.v1_dir, d / "stranger", d), d / "stranger.tar.gz")


def _not_a_bundle(b: Bundles, d: Path) -> Path:
    out = d / "junk.tar.gz"
    out.write_bytes(os.urandom(4096))
    return out


BAD: dict[str, tuple[Maker, str, str]] = {
    "bad signature (folder)": (
        lambda b, d: bad_signature_bundle(b.v1_dir, d / "badsig"),
        "signature",
        "bad signature",
    ),
    "bad signature": (
        lambda b, d: pack(bad_signature_bundle(b.v1_dir, d / "badsig"), d / "badsig.tar.gz"),
        "signature",
        "bad signature",
    ),
    "unknown key": (_unknown_key, "signature", "does not trust"),
    "unsigned": (_unsigned, "signature", "not signed"),
    "not a bundle": (_not_a_bundle, "signature", "not a readable bundle archive"),
    "hash mismatch (folder)": (lambda b, d: hash_mismatch_bundle(b.v1_dir, d / "hm"), "hashes", "tampered"),
    "hash mismatch": (
        lambda b, d: pack(hash_mismatch_bundle(b.v1_dir, d / "hm"), d / "hm.tar.gz"),
        "hashes",
        "SHA-256",
    ),
    "tar-slip": (lambda b, d: tar_slip_archive(b.v1_dir, d / "slip.tar.gz"), "hashes", r"'\.\.' component"),
    "absolute path": (
        lambda b, d: absolute_path_archive(b.v1_dir, d / "abs.tar.gz", d / "outside" / "evil.txt"),
        "hashes",
        "absolute path",
    ),
    "symlink out": (lambda b, d: symlink_out_archive(b.v1_dir, d / "link.tar.gz"), "hashes", "symlink"),
    "truncated": (
        lambda b, d: truncated_archive(b.v1_dir, d / "cut.tar.gz"),
        "hashes",
        "damaged or truncated",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_at_its_step_and_the_active_slot_stays(
    case: str, installed: StateRoot, bundles: Bundles, tmp_path: Path
) -> None:
    make, step, reason = BAD[case]
    work = tmp_path / "work"
    work.mkdir()
    bad = make(bundles, work)
    seen: list[str] = []
    result = install(installed, bad, "bad", PROFILE, lambda s, _: seen.append(s), health_runs=RUNS)
    assert not result.ok and result.step == step, result
    assert re.search(reason, result.reason), result.reason
    assert result.hint
    assert seen == list(STEPS[: STEPS.index(step) + 1])  # nothing ran after the failed step
    assert_untouched(installed, bundles.public_key)
    assert installed.clean_temps() == []  # no temp file left behind either
    assert not list(tmp_path.rglob("evil.txt")) and not (installed.path.parent / "evil.txt").exists()
    assert installed.deploy_record("bad") == result.to_dict()


def test_no_trusted_key_refuses_everything(bundles: Bundles, tmp_path: Path) -> None:
    root = StateRoot(tmp_path / "root")
    result = install(root, bundles.v1, "x", PROFILE)
    assert not result.ok and result.step == "signature" and "trusts no signing key" in result.reason
    assert "edgekit agent trust" in result.hint and root.active() is None


def test_a_bundle_without_eval_frames_fails_the_health_gate(installed: StateRoot, bundles: Bundles) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["eval_set"] = None

    old = resign(
        bundles.v1_dir,
        bundles.work / "old-style",
        bundles.private_key,
        edit=edit,
        change=lambda f: shutil.rmtree(f / "eval"),
    )
    result = install(installed, old, "old", PROFILE, health_runs=RUNS)
    assert not result.ok and result.step == "health" and "evaluation frames" in result.reason
    assert_untouched(installed, bundles.public_key)


# -- recovery ----------------------------------------------------------------------------


def _two_versions(root: StateRoot, bundles: Bundles) -> None:
    assert install(root, bundles.v2, "two", PROFILE, health_runs=RUNS).ok
    assert root.active() == "b"


def _back_on_v1(root: StateRoot, bundles: Bundles) -> None:
    """v1 active by an operator's rollback, v2 (the floor) in the other slot."""
    _two_versions(root, bundles)
    assert rollback(root, "back").ok and root.active() == "a"


def _on_v2_only(root: StateRoot, public_key: Path) -> None:
    assert root.active() == "b" and root.slot_info("a") is None and not any(root.slot_dir("a").iterdir())
    active = root.active_bundle()
    assert active is not None and verify(active, [public_key], require_signature=True).ok
    assert read_manifest(active).model.version == "2.0-test"


def test_recover_moves_off_a_dangling_active_slot(installed: StateRoot, bundles: Bundles) -> None:
    _back_on_v1(installed, bundles)
    shutil.rmtree(installed.slot_dir("a") / "bundle")  # the active slot's bundle is gone
    report = recover(installed)
    assert report["switched"] == "b" and "a" in report["cleared"]
    _on_v2_only(installed, bundles.public_key)


def test_recover_moves_off_a_damaged_active_bundle(installed: StateRoot, bundles: Bundles) -> None:
    _back_on_v1(installed, bundles)
    victim = next((installed.slot_bundle("a") / "artifacts").rglob("*.onnx"))
    victim.write_bytes(victim.read_bytes()[:1000])
    assert recover(installed)["switched"] == "b"
    _on_v2_only(installed, bundles.public_key)


def test_recover_never_makes_a_slot_below_the_floor_active(installed: StateRoot, bundles: Bundles) -> None:
    # v2 active and damaged, v1 (older) intact in the other slot: damage is no way around the floor.
    _two_versions(installed, bundles)
    victim = next((installed.slot_bundle("b") / "artifacts").rglob("*.onnx"))
    victim.write_bytes(victim.read_bytes()[:1000])
    report = recover(installed)
    v1, v2 = (read_manifest(d).build.serial for d in (bundles.v1_dir, bundles.work / "v2"))
    assert v1 < v2 and report["floor"] == v2
    assert report["switched"] == "none" and report["refused"] == {"a": {"serial": v1, "floor": v2}}
    assert installed.active() is None and installed.slot_info("a") is not None  # kept, not made active
    assert not install(installed, bundles.v1, "v1-again", PROFILE, health_runs=RUNS).ok  # the floor held


def test_recover_cleans_a_half_written_slot_and_temp_files(installed: StateRoot, bundles: Bundles) -> None:
    b = installed.slot_dir("b")
    (b / "bundle" / "artifacts").mkdir(parents=True)  # a kill during unpack: no slot.json
    (b / "bundle" / "manifest.json").write_text("{")
    (b / ".bundle.unpack-1234").mkdir()
    (installed.path / ".active.tmp-abcd").symlink_to("slots/b")
    (installed.path / ".state.json.tmp-abcd").write_text("{")
    report = recover(installed)
    assert report["switched"] is None and set(report["cleared"]) == {"b"}
    assert sorted(report["removed"]) == [
        ".active.tmp-abcd",
        ".state.json.tmp-abcd",
        "slots/b/.bundle.unpack-1234",
    ]
    assert_untouched(installed, bundles.public_key)
    assert sorted(p.name for p in installed.path.iterdir()) == [
        "active",
        "agent.lock",
        "deploys",
        "floor.json",  # the highest serial installed (anti-rollback)
        "incoming",
        "keys",
        "slots",
        "state.json",
    ]


def test_recover_with_no_complete_slot_leaves_nothing_active(installed: StateRoot) -> None:
    (installed.slot_dir("a") / "slot.json").unlink()
    report = recover(installed)
    assert report["switched"] == "none" and installed.active() is None and installed.active_bundle() is None
    assert not installed.active_link.is_symlink()
    status = installed.status()
    assert status["active"] is None and not status["slots"]["a"]["complete"]


def test_recover_repairs_an_active_link_to_somewhere_else(installed: StateRoot, bundles: Bundles) -> None:
    installed.active_link.unlink()
    installed.active_link.symlink_to("/etc")
    assert recover(installed)["switched"] == "a"
    assert_untouched(installed, bundles.public_key)


def test_cli_agent_errors_are_clear_and_unit_is_shipped(bundles: Bundles, tmp_path: Path) -> None:
    r = cli("agent", "trust", str(bundles.private_key), "--root", str(tmp_path / "r"))
    assert (
        r.returncode == 2 and "private key" in r.stderr and "hint" in r.stderr and "Traceback" not in r.stderr
    )
    r = cli("agent", "install", str(tmp_path / "missing.tar.gz"), "--root", str(tmp_path / "r"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = cli("agent", "install", str(bundles.v1), "--root", str(tmp_path / "r"), "--id", "../x")
    assert r.returncode == 2 and "deploy id" in r.stderr
    r = cli("agent", "unit")
    assert r.returncode == 0
    import configparser

    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read_string(r.stdout)
    service = unit["Service"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["NotifyAccess"] == "main" and service["WatchdogSec"] == "30"
    assert service["User"] == "edgekit" and service["StateDirectory"] == "edgekit"
    assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"
    assert service["ReadWritePaths"] == "/var/lib/edgekit"
    assert "agent run" in service["ExecStart"] and unit["Install"]["WantedBy"] == "multi-user.target"


def test_tar_members_helpers_are_really_bad(bundles: Bundles, tmp_path: Path) -> None:
    """The bad archives hold what their names say (else the refusal tests would prove nothing)."""
    with tarfile.open(tar_slip_archive(bundles.v1_dir, tmp_path / "s.tar.gz")) as t:
        assert "../../evil.txt" in t.getnames() and t.getnames()[0] == "manifest.json"
    with tarfile.open(symlink_out_archive(bundles.v1_dir, tmp_path / "l.tar.gz")) as t:
        assert any(m.issym() and m.linkname == "/etc/passwd" for m in t.getmembers())
    with tarfile.open(absolute_path_archive(bundles.v1_dir, tmp_path / "a.tar.gz", Path("/tmp/x/evil"))) as t:
        assert "/tmp/x/evil" in t.getnames()
