"""Apache TVM: runs a compiled Relax library (``.so``) on the Relax virtual machine.

The library holds the model's code and weights; its input and output specs travel beside
it as ``<stem>.io.json`` (the Relax executable does not keep them), written by
:func:`edgekit.convert.tvm.compile_onnx`, with the target it was compiled for.  Before loading,
the ELF header is read so that a library built for another architecture is refused with a
clear message instead of a dlopen error that claims the file does not exist; and a library
whose target implies CPU flags this CPU lacks (``+dotprod`` on a Cortex-A72, AVX-512 on an
AVX2 CPU) is refused too: it would load, and its first run would kill the process (SIGILL).

Batch: fixed (``batchable`` is False, ``batched`` refuses): the library is compiled and tuned
for the static shapes of its ``.io.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgekit.backends.base import (
    Availability,
    Options,
    Session,
    TensorSpec,
    check_artifact,
    known_options,
    load_failed,
)
from edgekit.core.elf import host_arch, read_elf
from edgekit.errors import ModelLoadError, RunError

if TYPE_CHECKING:
    import numpy as np

NAME = "tvm"
OPTIONS = frozenset({"device", "num_threads"})
IO_SUFFIX = ".io.json"


def io_path(library: Path) -> Path:
    """Where the input/output description of a compiled library lives."""
    return library.with_name(library.stem + IO_SUFFIX)


def read_io(library: Path) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, Any]]:
    """Read a library's ``.io.json``: ``{"inputs": [{name, shape, dtype}], "outputs": [...], "target": {...}}``.

    The target (``mcpu``, ``mattr``: what the code was compiled for) is ``{}`` for a library
    compiled before edgekit recorded it.
    """
    path = io_path(library)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        target = data.get("target", {})
        if not isinstance(target, dict):
            raise TypeError(f"target is a {type(target).__name__}, not an object")
        return (
            [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in data["inputs"]],
            [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"]) for t in data["outputs"]],
            target,
        )
    except FileNotFoundError as err:
        raise ModelLoadError(
            f"{NAME}: {library} has no input/output description {path.name} beside it",
            "compile the model with `edgekit build` (or edgekit.convert.tvm.compile_onnx), which writes both files",
        ) from err
    except (ValueError, KeyError, TypeError) as err:
        raise ModelLoadError(
            f"{NAME}: {path} is not a valid I/O description ({err})", "rebuild the model"
        ) from err


def cpu_lacks(target: dict[str, Any]) -> tuple[str, ...]:
    """The notable CPU flags a library compiled for ``target`` may use that this CPU does not report.

    Nothing when the target implies nothing known (``generic``, no ``mattr``) or when this
    CPU's flags could not be read at all: unknown is not lacking.
    """
    from edgekit.core.cpu import target_flags, this_cpu

    need, cpu = target_flags(target), this_cpu()
    if not need or not cpu.flags:
        return ()
    return tuple(sorted(need - cpu.flags))


class TVMBackend:
    """Runs TVM Relax libraries compiled for this host's CPU."""

    name = NAME
    suffixes = (".so",)
    options = OPTIONS

    def available(self, options: Options | None = None) -> Availability:
        try:
            import tvm
        except ImportError as err:
            return Availability(
                False, f"apache-tvm is not installed ({err})", hint='pip install "edgekit[tvm]"'
            )
        devices = ("cpu", "cuda") if tvm.cuda().exist else ("cpu",)
        device = str((options or {}).get("device", "cpu"))
        if device not in devices:
            return Availability(
                False,
                f"TVM device {device} is not present here",
                tvm.__version__,
                devices,
                'use device = "cpu", or a TVM build with that device\'s runtime',
            )
        return Availability(True, "", tvm.__version__, devices)

    def load(self, artifact: Path, options: Options | None = None) -> Session:
        opts = known_options(NAME, options, OPTIONS)
        artifact = check_artifact(NAME, artifact, self.suffixes)
        elf, here = read_elf(artifact), host_arch()
        if elf is None:
            raise ModelLoadError(
                f"{NAME}: {artifact} is not a shared library (no ELF header)",
                "the file may be corrupt or truncated: rebuild it with edgekit build",
            )
        built_for = elf.arch
        if built_for != here:
            raise ModelLoadError(
                f"{NAME}: {artifact} was built for {built_for}, this host is {here}",
                f"run it on an {built_for} device, or build for this host's profile (edgekit build --device ...)",
            )
        if not elf.complete:
            # dlopen of a truncated library can kill the process with SIGBUS: refuse it first.
            raise ModelLoadError(
                f"{NAME}: {artifact} is truncated (its ELF headers point past the end of the file)",
                "the copy was probably interrupted: copy or rebuild it again",
            )
        inputs, outputs, target = read_io(artifact)
        lacking = cpu_lacks(target)
        if lacking:
            # Loading it would work; its first run would die of SIGILL, taking the process along.
            from edgekit.core.cpu import target_attrs

            compiled_for = " ".join(str(v) for v in (target.get("mcpu", ""), *target_attrs(target)) if v)
            raise ModelLoadError(
                f"{NAME}: {artifact} was compiled for {compiled_for}: its code may use "
                f"{', '.join(lacking)}, which this CPU lacks",
                "build for this device's profile (edgekit build --device ...; edgekit doctor shows this CPU's flags)",
            )
        # tvm.runtime's VM (the class relax.VirtualMachine names), not tvm.relax: importing the
        # compiler's Python needs libtvm_compiler.so, which a device may leave out (runtime only).
        import tvm
        from tvm.runtime.vm import VirtualMachine

        device_name = str(opts.get("device", "cpu"))
        if "num_threads" in opts:
            # (affinity mode 0 = big cores, thread count); TVM's pool otherwise takes every core.
            tvm.get_global_func("runtime.config_threadpool")(0, int(opts["num_threads"]))
        try:
            lib = tvm.runtime.load_module(str(artifact))
            device = tvm.device(device_name, 0)
            vm = VirtualMachine(lib, device)
        except Exception as err:
            raise load_failed(NAME, artifact, err, f"a TVM Relax library compiled for {here}") from err
        return TVMSession(artifact, inputs, outputs, vm, device)


class TVMSession(Session):
    backend = NAME

    def __init__(
        self, artifact: Path, inputs: list[TensorSpec], outputs: list[TensorSpec], vm: Any, device: Any
    ) -> None:
        super().__init__(artifact, inputs, outputs, str(device))
        self._vm, self._dev = vm, device
        self._main = vm["main"]

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import tvm

        try:
            out = self._main(*[tvm.runtime.tensor(a, self._dev) for a in arrays])
            items = out if isinstance(out, (list, tuple)) or not hasattr(out, "numpy") else [out]
            return [t.numpy() for t in items]
        except Exception as err:
            raise RunError(
                f"{NAME} failed running {self.artifact}: {err}", "check the input against session.inputs"
            ) from err

    def close(self) -> None:
        self._vm = self._main = None
        super().close()
