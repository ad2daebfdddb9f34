"""``PipelineSupervisor``: the agent's child ``edgekit run <active bundle> ...``, kept running.

Restarted on request (after a switch), started again with back-off when it crashes, and
killed with the agent (``PR_SET_PDEATHSIG`` on Linux) so no orphan reports under its device id.
Under a unit with ``WatchdogSec=`` the child is watched too (``heartbeats``): it says
``READY=1`` and ``WATCHDOG=1`` on the agent's socket (``edgekit.deploy.child_watch``) while its
frames flow; a child that falls silent is wedged, and is killed and started again like a crash.
No secret goes on the child's command line (``ps`` shows it to every user): the agent hands
passwords over in the child's environment (``env``), and the command line it logs is redacted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgekit.core.backoff import Backoff
from edgekit.core.redact import has_secret, redact_source
from edgekit.core.sd_notify import NOTIFY_SOCKET, WATCHDOG_PID, WATCHDOG_USEC, watchdog_env
from edgekit.deploy.child_watch import ChildHeartbeats

log = logging.getLogger(__name__)

# A child that ran this long before it exited was healthy: the next crash starts the back-off again.
HEALTHY_RUN_S = 60.0
# A child that crashed sooner is started again after 2 s, then 4, 8 ... at most 60 s; one that was
# healthy after 1 s (and a crash soon after that waits 2 s again).
CRASH_BACKOFF_FIRST_S = 2.0
MAX_BACKOFF_S = 60.0
AFTER_HEALTHY_RUN_S = 1.0
STOP_CHILD_S = 10.0
# How long a watched child may take to say READY=1 (load the bundle, warm the model, open the
# camera): a first load that compiles for the device can take minutes; after it, the interval.
CHILD_START_GRACE_S = 300.0


class PipelineSupervisor:
    """Keeps ``edgekit run <active bundle> ...`` running: restart on request, back off when it crashes."""

    def __init__(
        self,
        command: Callable[[Path], list[str]],
        active_bundle: Callable[[], Path | None],
        on_state: Callable[[str], None] = lambda state: None,
        env: Callable[[], dict[str, str]] | None = None,
        heartbeats: ChildHeartbeats | None = None,
        watchdog_s: float | None = None,
    ) -> None:
        self._command = command
        self._env = env  # the child's environment (None: ours)
        # The child's heartbeats, and how long it may stay silent (both or neither).
        self._heartbeats = heartbeats if watchdog_s is not None else None
        self.watchdog_s = watchdog_s
        self.wedged = 0  # children killed for falling silent
        self._active_bundle = active_bundle
        self._on_state = on_state
        self.state = "stopped"
        self.starts = 0
        self.bundle: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._restart = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="edgekit-agent-pipeline", daemon=True)
        self._started = 0.0

    def start(self) -> PipelineSupervisor:
        self._thread.start()
        return self

    def restart(self) -> None:
        """Stop the child (if any) and start it again on the bundle that is active now."""
        self._restart.set()

    def stop(self) -> None:
        """Stop the child and the supervising thread."""
        self._stop.set()
        self._restart.set()
        if self._thread.is_alive():
            self._thread.join(STOP_CHILD_S + 5)
        self._end_child()

    @property
    def alive(self) -> bool:
        """Whether the supervising thread runs (or was never started): what the agent's own pet waits on."""
        return self._thread.is_alive() or self._thread.ident is None

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _set(self, state: str) -> None:
        if state != self.state:
            self.state = state
            try:
                self._on_state(state)
            except Exception:  # the status message is a report; supervising goes on without it
                log.exception("agent: reporting the pipeline state failed")

    def _run(self) -> None:
        backoff = Backoff(CRASH_BACKOFF_FIRST_S, cap_s=MAX_BACKOFF_S)
        while not self._stop.is_set():
            self._restart.clear()
            bundle = self._active_bundle()
            if bundle is None:
                self._set("none")  # nothing installed yet: wait for a deploy
                self._restart.wait()
                continue
            started = time.monotonic()
            try:
                self._spawn(bundle)
            except OSError as err:
                log.error("agent: cannot start the pipeline: %s", err)
            else:
                self._set("running")
                while not self._restart.wait(0.5):
                    if self._proc is not None and self._proc.poll() is not None:
                        break
                    silent = self._silent()
                    if silent:
                        self.wedged += 1
                        log.error("agent: the pipeline on %s %s: killing it (wedged)", bundle, silent)
                        self._kill_child()
                        break
            if self._restart.is_set():  # a switch or a stop: end the child, start again at once
                self._end_child()
                backoff.reset()
                continue
            code = self._proc.returncode if self._proc is not None else None
            ran = time.monotonic() - started
            if ran >= HEALTHY_RUN_S:
                backoff.reset()
                delay = AFTER_HEALTHY_RUN_S
            else:
                delay = backoff.next_delay()
            log.warning(
                "agent: the pipeline on %s exited with %s after %.0f s; starting it again in %g s",
                bundle, code, ran, delay,
            )  # fmt: skip
            self._set("backoff")
            self._restart.wait(delay)  # a restart or a stop ends the wait at once

    def _silent(self) -> str:
        """Why the watched child counts as wedged ("" while it does not, or is not watched)."""
        if self._heartbeats is None or self.watchdog_s is None:
            return ""
        ready, last = self._heartbeats.state()
        now = time.monotonic()
        if not ready:
            grace = max(CHILD_START_GRACE_S, self.watchdog_s)
            return f"did not say READY=1 within {grace:g} s" if now - self._started > grace else ""
        if now - last > self.watchdog_s:
            return f"sent no heartbeat for {now - last:.0f} s (the watchdog is {self.watchdog_s:g} s)"
        return ""

    def _spawn(self, bundle: Path) -> None:
        argv = self._command(bundle)
        env = self._env() if self._env is not None else None
        if self._heartbeats is not None and self.watchdog_s is not None:
            env = dict(os.environ) if env is None else env
            env.pop(WATCHDOG_PID, None)  # systemd's names the agent: the child's interval is its own
            env |= watchdog_env(self.watchdog_s, self._heartbeats.name)
        log.info("agent: starting the pipeline: %s", " ".join(redact_source(arg) for arg in argv))
        self.bundle = bundle
        self.starts += 1
        # stdout would be the per-frame view; the child's log lines (stderr) go where ours go.
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent
        )
        self._started = time.monotonic()
        if self._heartbeats is not None:
            self._heartbeats.watch(self._proc.pid)

    def _kill_child(self) -> None:
        # A wedged child does not answer SIGINT (its loop is stuck): no grace, like systemd's watchdog.
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def _end_child(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        # SIGINT first: `edgekit run` then ends its window, says offline and closes the camera.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(STOP_CHILD_S)
        except subprocess.TimeoutExpired:
            log.warning("agent: the pipeline did not stop within %g s; killing it", STOP_CHILD_S)
            proc.kill()
            proc.wait(5)


def child_environment(password: str | None, source: str | None) -> dict[str, str]:
    """Our environment plus the secrets the child must not get on its command line:
    the MQTT password (``EDGEKIT_MQTT_PASSWORD``) and a source holding one (``EDGEKIT_SOURCE``)."""
    from edgekit.core.tokens import ARTIFACT_TOKEN_ENV

    env = dict(os.environ)
    env.pop(ARTIFACT_TOKEN_ENV, None)  # the agent's download token: the pipeline never downloads
    # systemd's notify socket is the agent's (NotifyAccess=main): the child gets the agent's own
    # socket instead, when the unit has a watchdog (PipelineSupervisor's heartbeats).
    for name in (NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID):
        env.pop(name, None)
    if password:
        env["EDGEKIT_MQTT_PASSWORD"] = password
    if source is not None and has_secret(source):
        env["EDGEKIT_SOURCE"] = source  # `edgekit run --source` reads it
    return env


_prctl: Any = None
if sys.platform == "linux":
    import ctypes

    with contextlib.suppress(OSError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before any fork


def _die_with_parent() -> None:
    # In the child, before exec: if the agent is killed (SIGKILL, OOM), its pipeline goes too,
    # so a restarted agent never finds a second pipeline reporting under the same device id.
    if _prctl is not None:
        _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
