"""``edgekit run BUNDLE --config run.toml``: the run file read, checked, and overridden by the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest
from skimage import data

from edgekit.commands.run_config import MAX_BYTES, RunConfigError, load_run_config
from tests.conftest import edgekit as run_cli

CAT_CLASSES = {281, 282, 283, 284, 285}  # tabby, tiger cat, Persian, Siamese, Egyptian cat


def folder(path: Path, count: int) -> Path:
    path.mkdir()
    for i in range(count):
        cv2.imwrite(str(path / f"{i:02d}.png"), cv2.resize(data.chelsea()[..., ::-1], (320, 240)))
    return path


def write(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- the file, read in process ---------------------------------------------------------------


def test_every_key_is_read_with_its_type(tmp_path: Path) -> None:
    cfg = load_run_config(
        write(
            tmp_path,
            'sources = ["0", "synthetic:640x480@30"]\nbudget_ms = 33\npolicy = "drop-oldest"\n'
            'fps = 12.5\nrealtime = true\nbatch = 4\nwarm = "off"\nduration_s = 60\nframes = 100\ntop = 3\n',
        )
    )
    assert cfg.sources == ["0", "synthetic:640x480@30"]
    assert dict(cfg.values) | {"sources": None} == {
        "sources": None,
        "budget_ms": 33,
        "policy": "drop-oldest",
        "fps": 12.5,
        "realtime": True,
        "batch": 4,
        "warm": "off",
        "duration_s": 60,
        "frames": 100,
        "top": 3,
    }


def test_sources_as_a_table_keep_their_names_and_order(tmp_path: Path) -> None:
    cfg = load_run_config(write(tmp_path, '[sources]\nyard = "/dev/video2"\ndoor = "0"\n'))
    assert cfg.sources == {"yard": "/dev/video2", "door": "0"} and list(cfg.sources) == ["yard", "door"]
    assert load_run_config(write(tmp_path, "", "empty.toml")).values == {}


def test_a_camera_of_the_table_may_have_its_own_budget_and_policy(tmp_path: Path) -> None:
    import edgekit

    text = '[sources]\nyard = { source = "/dev/video2", budget_ms = 66, policy = "block" }\ndoor = "0"\n'
    cfg = load_run_config(write(tmp_path, text))
    assert cfg.sources == {"yard": edgekit.Camera("/dev/video2", budget_ms=66, policy="block"), "door": "0"}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('sorces = ["0"]\n', ["unknown key 'sorces'", "the keys of a run file are sources"]),
        ('budget_ms = "33"\n', ["budget_ms", "must be a number", "budget_ms = 33"]),
        ("realtime = 1\n", ["realtime", "true or false"]),
        ("frames = 2.5\n", ["frames", "whole number"]),
        ("top = true\n", ["top", "whole number"]),
        ("batch = true\n", ["batch", '"auto"']),
        ("sources = [0, 1]\n", ["sources", "list of source strings"]),
        ("sources = []\n", ["sources", "list of source strings"]),
        ('sources = "0"\n', ["sources", "list of source strings"]),
        ("[sources]\ndoor = 0\n", ["sources", "table of camera name"]),
        ("[sources]\ndoor = { budget_ms = 66 }\n", ["sources", "source = ..., budget_ms"]),
        ('[sources]\ndoor = { source = "0", budget = 66 }\n', ["sources", "own budget or policy"]),
        ("[budget_ms]\nx = 1\n", ["budget_ms", "got a table"]),
    ],
)
def test_a_wrong_key_or_type_names_the_key_and_the_file(tmp_path: Path, text: str, words: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(RunConfigError) as err:
        load_run_config(path)
    assert str(path) in err.value.message and err.value.hint
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_missing_not_toml_not_text_and_too_big(tmp_path: Path) -> None:
    cases = {
        tmp_path / "nowhere.toml": "no run file at",
        write(tmp_path, 'sources = ["0"\nbudget_ms = \n', "broken.toml"): "is not valid TOML",
        tmp_path: "is not a file",
    }
    (tmp_path / "bytes.toml").write_bytes(b"top = 5\n\xff\xfe")
    cases[tmp_path / "bytes.toml"] = "is not UTF-8"
    (tmp_path / "big.toml").write_text("# x\n" * (MAX_BYTES // 4 + 1))
    cases[tmp_path / "big.toml"] = f"at most {MAX_BYTES}"
    for path, words in cases.items():
        with pytest.raises(RunConfigError) as err:
            load_run_config(path)
        assert words in err.value.message and str(path) in err.value.message and err.value.hint


# -- through the command line ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('sources = ["0"]\nbudgte_ms = 33\n', "unknown key 'budgte_ms'"),
        ("policy = 3\n", "policy in the run file"),
        ('sources = ["0"\n', "is not valid TOML"),
        (None, "no run file at"),
    ],
)
def test_cli_a_bad_run_file_is_one_error_and_a_hint(
    cache_env: dict[str, str], tmp_path: Path, text: str | None, words: str
) -> None:
    path = write(tmp_path, text) if text is not None else tmp_path / "missing.toml"
    # The file is read before the bundle is opened: no bundle is needed to be told about it.
    r = run_cli(cache_env, "run", str(tmp_path / "no-bundle"), "--config", str(path), "--json")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and str(path) in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.slow
def test_cli_runs_the_cameras_and_settings_of_a_run_file(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], tmp_path: Path
) -> None:
    a, b = folder(tmp_path / "a", 3), folder(tmp_path / "b", 2)
    records = tmp_path / "records.jsonl"
    table = write(
        tmp_path,
        f'policy = "block"\nbudget_ms = 500\ntop = 2\nbatch = "off"\nwarm = "off"\n'
        f'[sources]\ndoor = "{a}"\nyard = "{b}"\n',
        "table.toml",
    )
    r = run_cli(
        cache_env,
        *("run", str(x86_bundle[0]), "--device", "x86_64-cpu", "--config", str(table)),
        *("--records", str(records), "--json"),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert {n: c["frames"] for n, c in doc["cameras"].items()} == {"door": 3, "yard": 2}
    assert (doc["policy"], doc["budget_ms"], doc["batch"]["max"]) == ("block", 500, 1)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(row["camera"] for row in rows) == ["door"] * 3 + ["yard"] * 2
    assert all(len(row["labels"]) == 2 and row["labels"][0]["id"] in CAT_CLASSES for row in rows)
    assert all("batch" not in row for row in rows)  # batch = "off": one frame per inference

    # A list of sources (cam0, cam1): a folder and a synthetic camera, stopped by the file's duration.
    listed = write(tmp_path, f'sources = ["{a}", "synthetic:320x240@30"]\nduration_s = 1.5\n', "list.toml")
    r = run_cli(
        cache_env, "run", str(x86_bundle[0]), "--device", "x86_64-cpu", "--config", str(listed), "--json"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert set(doc["cameras"]) == {"cam0", "cam1"} and doc["cameras"]["cam1"]["frames"] >= 1
    assert doc["ended_by"] == "duration" and doc["policy"] == "drop-oldest"  # a live camera's default


@pytest.mark.slow
def test_cli_options_win_over_the_run_file(
    x86_bundle: tuple[Path, dict[str, Any]], cache_env: dict[str, str], tmp_path: Path
) -> None:
    a, b, c = folder(tmp_path / "a", 3), folder(tmp_path / "b", 2), folder(tmp_path / "c", 4)
    path = write(
        tmp_path,
        f'budget_ms = 500\npolicy = "block"\ntop = 2\nframes = 2\nbatch = "off"\n[sources]\ndoor = "{a}"\nyard = "{b}"\n',
    )
    base = ("run", str(x86_bundle[0]), "--device", "x86_64-cpu", "--config", str(path), "--json")
    # --source replaces the file's cameras; --budget, --top, --frames replace its values; the rest stay.
    records = tmp_path / "records.jsonl"
    r = run_cli(
        cache_env,
        *base,
        *("--source", str(c), "--budget", "250", "--top", "1", "--frames", "3", "--records", str(records)),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert "cameras" not in doc and "door" not in doc["source"]  # one source: no per-camera table
    assert (doc["budget_ms"], doc["policy"], doc["frames"]) == (250, "block", 3)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(rows) == 3 and all(len(row["labels"]) == 1 for row in rows)
    assert not {row.get("camera") for row in rows} & {"door", "yard"}

    # --batch on the command line over the file's "off"; a bad value is the Pipeline's error.
    r = run_cli(cache_env, *base, "--batch", "2", "--frames", "5")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["frames"] == 5 and 1 <= doc["batch"]["max"] <= 2
    r = run_cli(cache_env, *base, "--batch", "many")
    assert r.returncode == 2 and "batch" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    # A value of the right type that the Pipeline refuses: its error, and the hint names the file.
    odd = write(tmp_path, f'warm = "sometimes"\nsources = ["{a}"]\n', "odd.toml")
    r = run_cli(cache_env, "run", str(x86_bundle[0]), "--device", "x86_64-cpu", "--config", str(odd))
    assert r.returncode == 2 and "warm" in r.stderr and str(odd) in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
