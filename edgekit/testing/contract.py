"""The contract every backend keeps, as checks that a third-party backend can run on itself.

A backend registered under the ``edgekit.backends`` entry point must behave as the built-in
ones do: describe its model, give the reference logits (within ``atol``), give fresh
outputs on every run, and refuse bad input, a closed session, a corrupt or missing file and
an unknown option with edgekit's errors, naming the backend, the file and what was expected.

Describe the backend under test with a ``Subject``: its registry name, a model file it
loads, an input in its layout and the logits that input must give (from any trusted
runtime).  Then either run everything at once::

    failures = run_contract(Subject("mybackend", Path("tiny.onnx"), x, logits), workdir)
    assert not failures, failures

or one test per check under pytest (as edgekit's own tests/test_backend_contract.py does)::

    @pytest.mark.parametrize("check", CHECKS.values(), ids=CHECKS.keys())
    def test_contract(check, tmp_path):
        check(subject, tmp_path)

A check raises ``AssertionError`` saying what broke; none needs pytest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from edgekit.backends import registry
from edgekit.backends.base import Backend, Session
from edgekit.errors import BackendError, EdgekitError, InputError, ModelLoadError


@dataclass(frozen=True)
class Subject:
    """The backend under test: its name, a model file it loads, an input and the output it must give."""

    backend: str
    artifact: Path
    input: np.ndarray  # in the backend's layout, float32
    expected: np.ndarray  # the model's output for ``input``
    options: Mapping[str, Any] = field(default_factory=dict)
    layout: str = "NCHW"  # of ``input``: NCHW or NHWC
    atol: float = 1e-4

    def get(self) -> Backend:
        return registry.get(self.backend)

    def open(self) -> Session:
        return self.get().load(self.artifact, dict(self.options))


Check = Callable[[Subject, Path], None]
CHECKS: dict[str, Check] = {}
_E = TypeVar("_E", bound=BaseException)


def _check(fn: Check) -> Check:
    CHECKS[fn.__name__] = fn
    return fn


def unavailable(subject: Subject) -> str | None:
    """Why the backend cannot run here (``None`` when it can): a suite skips rather than fails then."""
    try:
        avail = subject.get().available(dict(subject.options))
    except EdgekitError as err:
        return err.message
    return None if avail.ok else avail.reason or "unavailable"


def _raises(kind: type[_E], call: Callable[[], object], match: str = "") -> _E:
    """The ``kind`` error ``call()`` raised (its text matching ``match``); AssertionError otherwise."""
    try:
        got = call()
    except kind as err:
        assert re.search(match, str(err)), f"{kind.__name__} {str(err)!r} does not match {match!r}"
        return err
    if isinstance(got, Session):
        got.close()
    raise AssertionError(f"expected {kind.__name__}, nothing was raised")


def _wrong_shape(x: np.ndarray, layout: str) -> tuple[int, ...]:
    """An input of the other layout at half the size: what a caller mixing up models would pass."""
    if x.ndim != 4:
        return (*x.shape, 2)
    if layout == "NCHW":
        n, c, h, w = x.shape
        return (n, h // 2, w // 2, c)
    n, h, w, c = x.shape
    return (n, c, h // 2, w // 2)


@_check
def available_reports_a_version(subject: Subject, workdir: Path) -> None:
    avail = subject.get().available(dict(subject.options))
    assert avail.ok and avail.version, avail


@_check
def specs_describe_the_model(subject: Subject, workdir: Path) -> None:
    with subject.open() as session:
        assert isinstance(session, Session)
        assert session.backend == subject.backend
        (inp,) = session.inputs
        assert inp.dtype == "float32", inp
        assert inp.shape == subject.input.shape, inp
        assert inp.layout == subject.layout, inp
        (out,) = session.outputs
        assert out.shape == subject.expected.shape and out.dtype == "float32", out
        assert session.device


@_check
def same_outputs_as_the_reference(subject: Subject, workdir: Path) -> None:
    with subject.open() as session:
        (logits,) = session.run(subject.input)
    assert logits.shape == subject.expected.shape
    np.testing.assert_allclose(logits, subject.expected, atol=subject.atol, rtol=0)


@_check
def runs_repeatedly_with_fresh_outputs(subject: Subject, workdir: Path) -> None:
    with subject.open() as session:
        (first,) = session.run(subject.input)
        (second,) = session.run(np.zeros_like(subject.input))
    assert not np.allclose(first, second), "an output buffer reused across runs makes these equal"
    np.testing.assert_allclose(first, subject.expected, atol=subject.atol, rtol=0)


@_check
def reads_an_input_it_may_not_write(subject: Subject, workdir: Path) -> None:
    # A server decodes a request's tensor with np.frombuffer over the received bytes, which is
    # read-only; so is a memory-mapped file.  A backend that shares the caller's memory with
    # its runtime must still run it, and leave it alone.
    x = np.frombuffer(subject.input.tobytes(), dtype=subject.input.dtype).reshape(subject.input.shape)
    assert not x.flags.writeable
    with subject.open() as session:
        (logits,) = session.run(x)
    np.testing.assert_allclose(logits, subject.expected, atol=subject.atol, rtol=0)
    np.testing.assert_array_equal(x, subject.input)


@_check
def wrong_shape_names_backend_file_and_expectation(subject: Subject, workdir: Path) -> None:
    x = subject.input
    with subject.open() as session:
        bad = np.zeros(_wrong_shape(x, subject.layout), np.float32)
        text = str(_raises(InputError, lambda: session.run(bad)))
        assert subject.backend in text and session.artifact.name in text, text
    assert f"expected input: float32[{', '.join(map(str, x.shape))}]" in text, text


@_check
def wrong_dtype_names_expected_dtype(subject: Subject, workdir: Path) -> None:
    with subject.open() as session:
        text = str(_raises(InputError, lambda: session.run(subject.input.astype(np.float64))))
    assert "float64" in text and "float32" in text and subject.backend in text, text


@_check
def wrong_number_of_inputs(subject: Subject, workdir: Path) -> None:
    x = subject.input
    with subject.open() as session:
        _raises(InputError, lambda: session.run(x, x), match="got 2 input")


@_check
def closed_session_refuses_to_run(subject: Subject, workdir: Path) -> None:
    session = subject.open()
    session.close()
    _raises(InputError, lambda: session.run(subject.input), match="closed")


@_check
def corrupt_model_file(subject: Subject, workdir: Path) -> None:
    good = subject.artifact
    bad = workdir / good.name
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 3])  # truncated, as by an interrupted copy
    for sidecar in good.parent.glob(good.stem + ".*"):  # e.g. OpenVINO's .bin beside the .xml
        if sidecar != good and not (workdir / sidecar.name).exists():
            (workdir / sidecar.name).write_bytes(sidecar.read_bytes())
    err = _raises(ModelLoadError, lambda: subject.get().load(bad, dict(subject.options)))
    assert subject.backend in str(err) and str(bad) in str(err), err
    assert err.hint, "a load error says what to do"


@_check
def missing_file(subject: Subject, workdir: Path) -> None:
    missing = workdir / ("nothing" + "".join(subject.artifact.suffixes))
    _raises(
        ModelLoadError, lambda: subject.get().load(missing, dict(subject.options)), match="does not exist"
    )


@_check
def unknown_option_is_refused(subject: Subject, workdir: Path) -> None:
    options = {**subject.options, "nmu_threads": 2}  # a typo of a real option
    _raises(BackendError, lambda: subject.get().load(subject.artifact, options), match="unknown option")


def run_contract(subject: Subject, workdir: Path) -> dict[str, str]:
    """Every check; returns the failed ones, ``{check: what broke}`` (empty: the backend keeps the contract).

    ``workdir`` is an empty folder the checks may write to.  A backend unavailable here fails
    every check with its reason: call ``unavailable`` first to skip instead.
    """
    failures: dict[str, str] = {}
    for name, check in CHECKS.items():
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            check(subject, folder)
        except Exception as err:  # noqa: BLE001 - whatever a backend raises instead of keeping a rule breaks it
            failures[name] = f"{type(err).__name__}: {err}"
    return failures
