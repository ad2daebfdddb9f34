"""A new user's first hour, as the README walks it: their own key, their bundle, ``edgekit.load``.

``edgekit keys generate`` writes a key pair to the config folder; a bundle signed with it
runs through ``edgekit.load`` and ``edgekit run`` alike, with no key named (one trust rule
for both); ``trusted_keys`` takes a path as ``str``, ``Path`` or a list; a refusal's hint
names what the caller can pass (``trusted_keys=`` in Python, ``--key`` on the command line);
a bundle path that is not there says so; and ``edgekit build`` checks its signing key before
it converts anything.  Against tiny real bundles and the real command.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_detector import classifier_bundle

import edgekit
from edgekit.errors import EdgekitError


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny classifier bundle and the public key that signed it (not in any trust store)."""
    from edgekit.bundle import generate_keypair

    private, public = generate_keypair(tmp_path / "keys" / "builder")
    return classifier_bundle(tmp_path / "bundle", private), public


def frame() -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)


@pytest.mark.parametrize("form", ["str", "Path", "list of str", "tuple of Path", "~"])
def test_trusted_keys_takes_a_path_as_str_path_or_a_list(
    signed: tuple[Path, Path], form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle, public = signed
    monkeypatch.setenv("HOME", str(public.parent))
    keys = {
        "str": str(public),
        "Path": public,
        "list of str": [str(public)],
        "tuple of Path": (public,),
        "~": f"~/{public.name}",
    }[form]
    with edgekit.load(bundle, device="x86_64-cpu", trusted_keys=keys) as model:
        assert model.classify(frame())


@pytest.mark.parametrize(
    "keys", [42, b"k.pub.pem", [Path("k.pub.pem"), 7]], ids=["int", "bytes", "list-with-int"]
)
def test_trusted_keys_of_another_type_is_a_clear_error(signed: tuple[Path, Path], keys: object) -> None:
    with pytest.raises(EdgekitError) as err:
        edgekit.load(signed[0], device="x86_64-cpu", trusted_keys=keys)  # type: ignore[arg-type]
    assert "trusted_keys takes a path" in err.value.message and "trusted_keys=" in err.value.hint
