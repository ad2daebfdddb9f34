"""The agent's command path, shared by the real agent and the simulated ones: parse, check, answer once.

``CommandHandling.handle`` is what ``edgekit agent run`` does with each payload on its
``cmd`` topic, in order: ``parse_command`` (this device, this fleet, a well-formed body), the
``CommandGuard``'s signature and expiry check, a deploy id handled before answered with its
recorded outcome (``replayed``), the nonce taken (a replay refused), the rollback limit, then
``_run_command`` (the subclass's: a real download and install in ``edgekit.deploy.agent``,
a simulated one in ``edgekit.deploy.sim_agents``), and one final result on ``cmd/result``.

It lives apart from the agent so that a simulated fleet of thousands of agents runs *this*
code, not a copy of it: a wave rollout benchmarked against the simulation is checked by the
same refusals a device makes.
"""

from __future__ import annotations

import logging
from typing import Any

from edgekit.deploy.agent_wire import plain
from edgekit.deploy.command_trust import CommandGuard, CommandRefused
from edgekit.errors import EdgekitError
from edgekit.protocol.control import Command, CommandError, parse_command, result_message
from edgekit.protocol.control_messages import PROOF_ACTIONS

log = logging.getLogger("edgekit.deploy.agent")


class CommandHandling:
    """The command path of an agent; a subclass says how to publish, run a command and read a record."""

    device_id: str
    fleet: str
    result_topic: str
    guard: CommandGuard
    handled: int
    refused: int
    busy: str | None

    # -- what a subclass provides --------------------------------------------------------------

    def _publish(self, topic_: str, body: dict[str, Any], retain: bool = False) -> None:
        raise NotImplementedError

    def publish_status(self) -> None:
        raise NotImplementedError

    def _recorded(self, deploy_id: str) -> dict[str, Any] | None:
        """The recorded outcome of ``deploy_id``, if it was handled before."""
        raise NotImplementedError

    def _run_command(self, cmd: Command) -> dict[str, Any]:
        """Run an authenticated deploy or rollback; publishes and returns its final result."""
        raise NotImplementedError

    def _proof_command(self, cmd: Command, payload: bytes) -> dict[str, Any]:
        return self._final(
            cmd.id, cmd.action, "command", ok=False, reason="this agent keeps no event proofs", hint=""
        )

    # -- the path --------------------------------------------------------------------------------

    def handle(self, payload: bytes) -> dict[str, Any]:
        """Handle one command payload; publishes progress and the final result, and returns the latter."""
        try:
            cmd = parse_command(payload, self.device_id, self.fleet)
        except CommandError as err:
            self.refused += 1
            log.warning(
                "agent: refused a command (%d bytes, id %s): %s", len(payload), err.deploy_id, err.message
            )
            return self._final(err.deploy_id, None, "command", ok=False, reason=err.message, hint=err.hint)
        try:
            self.guard.authenticate(payload, cmd)
        except CommandRefused as err:
            return self._refuse(cmd, payload, err)
        self.handled += 1
        if cmd.action in PROOF_ACTIONS:  # reads only: no deploy record, no busy status
            return self._proof_command(cmd, payload)
        recorded = self._recorded(cmd.id)
        if recorded is not None:
            log.info(
                "agent: %s %s was handled before: answering with its recorded outcome", cmd.action, cmd.id
            )
            return self._final(
                cmd.id,
                cmd.action,
                str(recorded.get("step") or "done"),
                ok=bool(recorded.get("ok")),
                reason=str(recorded.get("reason") or ""),
                hint=str(recorded.get("hint") or ""),
                health=recorded.get("health") if isinstance(recorded.get("health"), dict) else None,
                version=recorded.get("version") if isinstance(recorded.get("version"), str) else None,
                replayed=True,
            )
        try:
            self.guard.take_nonce(cmd)
        except CommandRefused as err:
            return self._refuse(cmd, payload, err)
        try:
            if cmd.action == "rollback":
                self.guard.take_rollback()
        except CommandRefused as err:
            self.guard.settle(cmd)  # refused for good: a later copy of it is a replay
            return self._refuse(cmd, payload, err)
        log.info("agent: %s %s", cmd.action, cmd.id)
        self.busy = cmd.id
        self.publish_status()
        try:
            return self._run_command(cmd)
        except EdgekitError as err:  # the root refused (a lock held too long, a disk that is full)
            log.error("agent: %s %s: %s", cmd.action, cmd.id, err.message)
            return self._final(cmd.id, cmd.action, "install", ok=False, reason=err.message, hint=err.hint)
        except Exception as err:  # a bug: still answer, so a rollout does not wait for nothing
            log.exception("agent: %s %s failed", cmd.action, cmd.id)
            return self._final(
                cmd.id, cmd.action, "agent", ok=False, reason=f"the agent failed: {err}", hint="see its log"
            )
        finally:
            self.guard.settle(cmd)  # answered (recorded, or a final failure): never run again
            self.busy = None
            self.publish_status()

    def _refuse(self, cmd: Command, payload: bytes, err: CommandRefused) -> dict[str, Any]:
        self.refused += 1
        log.warning("agent: refused %s %s (%d bytes): %s", cmd.action, cmd.id, len(payload), err.message)
        return self._final(cmd.id, cmd.action, "command", ok=False, reason=err.message, hint=err.hint)

    def _progress(self, cmd: Command, step: str, info: dict[str, Any]) -> None:
        body = result_message(self.device_id, cmd.id, step, final=False, action=cmd.action, info=plain(info))
        self._publish(self.result_topic, body)

    def _final(
        self, deploy_id: str | None, action: str | None, step: str, *, ok: bool, **fields: Any
    ) -> dict[str, Any]:
        body = result_message(self.device_id, deploy_id, step, final=True, ok=ok, action=action, **fields)
        self._publish(self.result_topic, body)
        return body
