"""``edgekit.load(bundle)``: a bundle as a model that classifies (or detects in) frames on the best backend here.

Loading verifies the bundle (every file's hash; its signature by a trusted key, required
unless ``allow_unsigned``: see ``edgekit.bundle.trust``), picks the device profile (``device="auto"`` detects this host), matches the
profile's candidates to the bundle's artifacts and loads the first that runs here, with
one logged fallback per failure.  Artifacts the profile does not mention are tried last,
with their default options, so a bundle built for another device still runs if anything
in it can.

Which candidate comes first: the bundle's own selection when it fits this host (``edgekit
bench --write-selection``); else, by default, the fastest at the camera rate on this very
host, measured on the first load of the bundle here and read back on every later one
(``edgekit.selection.measured.choose_here``); else (``measure=False``) the profile's order.
``Model.selection`` says which of these it was.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING

from edgekit.backends.base import Session
from edgekit.core.elf import host_arch
from edgekit.detection.detector import Detection, Detector
from edgekit.device.profiles import Candidate
from edgekit.errors import EdgekitError, InputError
from edgekit.processing.postprocess import Label, top_k
from edgekit.processing.preprocessing import PreprocessSpec
from edgekit.selection.candidate_timing import MeasureLimits
from edgekit.selection.matching import artifact_for, candidates_for
from edgekit.selection.measured import CandidateChoice

if TYPE_CHECKING:
    import numpy as np

    from edgekit.bundle.keys import KeyPaths
    from edgekit.bundle.manifest import Manifest
    from edgekit.processing.preprocessing import Preprocessor

log = logging.getLogger(__name__)


class Model:
    """A loaded bundle: ``classify(frame)`` returns a classifier's top labels, ``detect(frame)`` a
    detector's objects (``task`` says which the bundle is).  Close it (or use ``with``)."""

    def __init__(
        self,
        manifest: Manifest,
        session: Session,
        root: Path,
        cleanup: Path | None = None,
        candidates: Sequence[Candidate] = (),
        load_ms: Mapping[str, float] | None = None,
        selection: CandidateChoice | None = None,
    ) -> None:
        self.manifest = manifest
        self.session = session
        self.root = root
        self._cleanup = cleanup
        self.preprocess = PreprocessSpec.from_manifest(manifest)
        self.labels: tuple[str, ...] = tuple(manifest.labels)
        self.candidates: tuple[Candidate, ...] = tuple(candidates)  # what load() chose among, in order
        # Each thread its own preprocessors: one writes every frame into the same buffer, so two
        # threads sharing one (a server's worker and a camera loop) would overwrite each other's.
        self._preps = threading.local()
        #: What ``load()`` spent, in ms, by phase (``imports``, ``unpack``, ``verify``, ``profile``,
        #: ``session``; a runtime's import counts where it happens): the cold-start breakdown.
        self.load_ms: Mapping[str, float] = MappingProxyType(dict(load_ms or {}))
        #: Which candidate runs and why: measured here now, cached from an earlier measurement,
        #: the bundle's selection, or the profile's order (``edgekit run`` prints it).
        self.selection: CandidateChoice = selection or CandidateChoice("profile", session.candidate)
        #: A detector's decoder, compiled once (anchors generated here, not per frame); None for a classifier.
        self.detector: Detector | None = None
        if manifest.detection is not None:
            try:
                self.detector = Detector(manifest.detection, self.preprocess, self.labels)
            except BaseException:
                self.close()  # a head that does not fit the model: the session and unpacked files go too
                raise

    @property
    def name(self) -> str:
        return self.manifest.model.name

    @property
    def backend(self) -> str:
        """The backend really used (after any fallback)."""
        return self.session.backend

    @property
    def candidate(self) -> str:
        return self.session.candidate

    @property
    def task(self) -> str:
        """``"classification"`` (``classify``) or ``"detection"`` (``detect``): the bundle's ``model.task``."""
        return self.manifest.model.task

    @property
    def logits(self) -> bool:
        """Whether the output still needs a softmax."""
        return self.manifest.model.output != "probabilities"

    def preprocessor(
        self, session: Session | None = None, color: str = "BGR", *, fresh: bool = False
    ) -> Preprocessor:
        """The frame -> tensor function for ``session`` (this model's own by default).

        It returns the same buffer for every frame, so it belongs to one thread: it is cached per
        calling thread, and ``fresh=True`` makes a new one for a thread that will own it (made
        here, used there, as a pipeline's loop does).
        """
        from edgekit.processing.preprocessing import Preprocessor

        session = session or self.session
        if fresh:
            return Preprocessor(self.preprocess, session.inputs[0], image_color=color)
        # A thread-local's __dict__ is the calling thread's own.
        cache: dict[tuple[int, str], Preprocessor] = self._preps.__dict__.setdefault("cache", {})
        key = (id(session), color)
        if key not in cache:
            cache[key] = self.preprocessor(session, color, fresh=True)
        return cache[key]

    def outputs(self, frame: np.ndarray, color: str = "BGR") -> list[np.ndarray]:
        """One frame (HxWx3 in ``color`` order; gray, BGRA and 16-bit converted) -> every output, as float.

        In the session's output order and shapes, dequantized when an output is quantized:
        what a detector's decoder (or your own post-processing) starts from.
        """
        from edgekit.processing.preprocessing import as_bgr

        image, _ = as_bgr(frame)
        return self._outputs(image, color)

    def _outputs(self, image: np.ndarray, color: str) -> list[np.ndarray]:
        from edgekit.processing.tensors import from_output

        ys = self.session.run(self.preprocessor(color=color)(image))
        return [from_output(y, spec) for y, spec in zip(ys, self.session.outputs, strict=True)]

    def infer(self, frame: np.ndarray, color: str = "BGR") -> np.ndarray:
        """One frame (HxWx3 in ``color`` order; gray, BGRA and 16-bit converted) -> the float output row.

        The first output only, flattened: a classifier's scores.  Kept as it was for callers
        that predate detection; ``outputs`` gives every output, ``detect`` a detector's objects.
        """
        from edgekit.processing.preprocessing import as_bgr
        from edgekit.processing.tensors import from_output

        image, _ = as_bgr(frame)
        y = self.session.run(self.preprocessor(color=color)(image))[0]
        return from_output(y, self.session.outputs[0]).reshape(-1)

    def classify(self, frame: np.ndarray, k: int = 5, color: str = "BGR") -> tuple[Label, ...]:
        """The ``k`` most likely labels for one frame, best first (a classifier's; see ``task``)."""
        if self.detector is not None:
            raise InputError(
                f"{self.name} is a detector: it finds objects in a frame, it does not classify it",
                "call model.detect(frame) (model.task says which a bundle is)",
            )
        from edgekit.processing.preprocessing import as_bgr

        image, _ = as_bgr(frame)
        return self.top_labels(self.session.run(self.preprocessor(color=color)(image)), k)

    def top_labels(self, raw: Sequence[np.ndarray], k: int = 5) -> tuple[Label, ...]:
        """A classifier's ``k`` best labels from the session's raw outputs (``classify``'s last step)."""
        from edgekit.processing.tensors import from_output

        scores = from_output(raw[0], self.session.outputs[0]).reshape(-1)
        return top_k(scores, self.labels, k, logits=self.logits)

    def detect(self, frame: np.ndarray, color: str = "BGR") -> tuple[Detection, ...]:
        """The objects in one frame, best score first, boxes in the frame's own pixels (a detector's)."""
        from edgekit.processing.preprocessing import as_bgr

        if self.detector is None:
            raise InputError(
                f"{self.name} is a classifier: it labels a whole frame, it does not find objects",
                "call model.classify(frame) (model.task says which a bundle is)",
            )
        image, _ = as_bgr(frame)
        return self.objects(self.session.run(self.preprocessor(color=color)(image)), image.shape[:2])

    def objects(self, raw: Sequence[np.ndarray], frame_hw: tuple[int, ...]) -> tuple[Detection, ...]:
        """A detector's objects from the session's raw outputs, boxes in pixels of a ``frame_hw`` frame
        (``detect``'s last step)."""
        from edgekit.processing.tensors import from_output

        if self.detector is None:
            raise InputError(f"{self.name} is a classifier: it has no objects", "call model.top_labels(raw)")
        outputs = [from_output(y, spec) for y, spec in zip(raw, self.session.outputs, strict=True)]
        names = [o.name for o in self.session.outputs]
        return self.detector(outputs, (frame_hw[0], frame_hw[1]), names)

    def load_alternatives(self) -> list[Session]:
        """Every other artifact of the bundle that loads here, each as its own session (caller closes).

        What the ``degrade`` policy measures and switches between; an artifact that does not
        load here is skipped with a log line.  Each one's files are hashed first (``load()``
        hashed only its own): one that differs from the manifest raises ``VerificationError``.
        """
        from edgekit.backends import registry
        from edgekit.bundle.verify import check_files
        from edgekit.selection.plan import backend_availability

        sessions: list[Session] = []
        for cand in self.candidates:
            if cand.key == self.session.candidate:
                continue
            art = artifact_for(cand, self.manifest.artifacts)
            if art is None or not backend_availability(cand).ok:
                continue
            try:
                check_files(self.root, self.manifest, [f.path for f in art.files])
            except EdgekitError:
                for opened in sessions:
                    opened.close()
                raise
            try:
                s = registry.get(cand.backend).load(self.root / art.path, cand.options)
            except EdgekitError as err:
                log.info("alternative %s does not load here: %s", cand.key, err.message)
                continue
            s.candidate = cand.key
            sessions.append(s)
        return sessions

    def close(self) -> None:
        self.session.close()
        if self._cleanup is not None:
            shutil.rmtree(self._cleanup, ignore_errors=True)
            self._cleanup = None

    def __enter__(self) -> Model:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Model {self.name} on {self.session.backend}/{self.session.device} ({self.candidate})>"


def load(
    bundle: str | Path,
    device: str = "auto",
    *,
    trusted_keys: KeyPaths | None = None,
    require_signature: bool = True,
    allow_unsigned: bool = False,
    measure: bool | MeasureLimits | None = None,
    progress: Callable[[str], None] | None = None,
) -> Model:
    """Verify and load a bundle (directory or .tar.gz) on the best backend for ``device``.

    The bundle must be signed by a trusted key: one of ``trusted_keys`` when given (a public
    key's path, ``str`` or ``Path``, or a list of them; then only those), else one in the trust
    store (``edgekit.bundle.trust``), which holds the key ``edgekit keys generate`` made.  ``allow_unsigned``
    loads a bundle that is unsigned, or signed by a key nobody here trusts, with a warning
    (never one whose signature is bad, nor an unsigned one when ``trusted_keys`` are given).
    ``require_signature`` is kept for old callers: a signature is required either way.
    The manifest used is parsed from the very bytes whose signature was checked.

    ``measure``: with no bundle selection for this host, the first load of a bundle here
    measures its candidates at the camera rate (a few seconds, bounded by ``MeasureLimits``;
    pass one to change the bounds or the rate) and keeps the ranking in the state folder,
    so later loads start at once on the fastest; ``False`` keeps the profile's order; None
    (the default) measures unless ``$EDGEKIT_MEASURE=0``.
    Candidates whose artifact failed the build's accuracy gate are never measured ahead of
    those that passed.  ``progress`` receives one line per step of a measurement.
    """
    load_ms: dict[str, float] = {}
    t0 = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal t0
        now = time.perf_counter()
        load_ms[name] = (now - t0) * 1e3
        t0 = now

    from edgekit.bundle import unpack, verify
    from edgekit.bundle.trust import keys_for, require_trusted
    from edgekit.bundle.verify import check_files
    from edgekit.device.host import match_profile
    from edgekit.device.profiles import get_profile
    from edgekit.selection.measured import choose_here, measure_by_default, measured_order, with_threads
    from edgekit.selection.plan import select

    phase("imports")
    path = Path(bundle)
    cleanup: Path | None = None
    if not path.is_dir():
        cleanup = Path(tempfile.mkdtemp(prefix="edgekit-model-"))
        try:
            path = unpack(path, cleanup / "bundle")
        except BaseException:
            shutil.rmtree(cleanup, ignore_errors=True)
            raise
        phase("unpack")
    try:
        # Every file's presence and size now; an artifact's hashes just before it loads (resolve).
        keys, explicit = keys_for(trusted_keys)
        report = verify(path, keys, hash_files=())
        report.raise_if_failed()
        require_trusted(
            Path(bundle), report.signature, report.key_id, explicit=explicit, allow_unsigned=allow_unsigned
        )
        manifest = report.manifest  # parsed from the bytes whose signature was checked: no second read
        assert manifest is not None  # a report that passed has one
        phase("verify")
        profile = match_profile() if device == "auto" else get_profile(device)
        phase("profile")
        artifacts = manifest.artifacts

        def resolve(c: Candidate) -> Path | None:
            a = artifact_for(c, artifacts)
            if a is None:
                return None
            if a.name not in hashed:
                t = time.perf_counter()
                check_files(path, manifest, [f.path for f in a.files])
                hashed.add(a.name)
                load_ms["hash"] = load_ms.get("hash", 0.0) + (time.perf_counter() - t) * 1e3
            return path / a.path

        hashed: set[str] = set()

        candidates = candidates_for(profile, artifacts)
        # Measured on a device like this one (edgekit bench --write-selection): fastest first.
        latency, threads = measured_order(manifest, profile.name, candidates, host_arch())
        candidates = [with_threads(c, threads.get(c.key)) for c in candidates]
        opened: Session | None = None
        if latency:
            # The bundle's selection wins over this host's own measurement: someone measured it
            # on purpose, with SingleStream's full run and the accuracy check on the evaluation
            # frames, on a device of this profile and architecture, and signed it into the
            # bundle; every device of the fleet then runs the same artifact.  A few seconds of
            # automatic measurement are the default for bundles nobody measured, not an override.
            choice = CandidateChoice("bundle", latency_ms=latency)
        elif measure or (measure is None and measure_by_default()):
            limits = measure if isinstance(measure, MeasureLimits) else MeasureLimits()
            t, hashed_before = time.perf_counter(), load_ms.get("hash", 0.0)
            choice, opened = choose_here(
                path,
                manifest,
                profile,
                candidates,
                lambda c: _open(c, resolve),
                _input_for(manifest),
                limits,
                progress,
            )
            latency = choice.ranking()  # the untimed ranked by the build's figures, after scaling
            if choice.how == "measured":  # the first load's cost, as its own phase (hashing stays its own)
                hashing = load_ms.get("hash", 0.0) - hashed_before
                load_ms["measure"] = (time.perf_counter() - t) * 1e3 - hashing
        else:
            choice = CandidateChoice("profile")
        session = select(candidates, resolve, latency or None, opened)
        choice = replace(choice, candidate=session.candidate)
    except BaseException:
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        raise
    phase("session")
    load_ms["session"] -= load_ms.get("hash", 0.0) + load_ms.get("measure", 0.0)
    if session.fallbacks:
        log.warning(
            "%s runs on %s after: %s",
            manifest.model.name,
            session.candidate,
            "; ".join(f"{who}: {why}" for who, why in session.fallbacks),
        )
    if choice.how in ("measured", "cached"):
        log.info("%s runs on %s", manifest.model.name, choice.describe())
    return Model(manifest, session, path, cleanup, candidates, load_ms, choice)


def _open(candidate: Candidate, resolve: Callable[[Candidate], Path | None]) -> Session:
    """Load ``candidate``'s artifact (its files hashed first, by ``resolve``) on its backend."""
    from edgekit.backends import registry

    where = resolve(candidate)
    if where is None:  # measuring takes only candidates with an artifact here
        raise InputError(f"{candidate.key}: no artifact in this bundle", "rebuild the bundle")
    return registry.get(candidate.backend).load(where, candidate.options)


def _input_for(manifest: Manifest) -> Callable[[Session], list[np.ndarray]]:
    """A session -> the inputs of one camera frame, preprocessed as the frame loop does (for measuring)."""

    def make(session: Session) -> list[np.ndarray]:
        import numpy as np

        from edgekit.processing.preprocessing import Preprocessor

        # A fixed noisy VGA frame: real pixels (no all-zero shortcut a runtime could take),
        # the same for every candidate.
        frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
        first = Preprocessor(PreprocessSpec.from_manifest(manifest), session.inputs[0])(frame)
        rest = [np.zeros([d or 1 for d in s.shape], np.dtype(s.dtype)) for s in session.inputs[1:]]
        return [first, *rest]

    return make
