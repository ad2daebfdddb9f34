"""The MQTT topic tree and the schema ids its JSON payloads carry: one place for both.

    edgekit/v1/<fleet>/<device>/status       retained: online/offline and the birth facts (telemetry)
    edgekit/v1/<fleet>/<device>/telemetry    every interval: sketches, counters, gauges
    edgekit/v1/<fleet>/<device>/labels       optional: what the model said
    edgekit/v1/<fleet>/<device>/events       each zone or line event (at least once; dedupe on its id)
    edgekit/v1/<fleet>/<device>/agent        retained: the deploy agent's status
    edgekit/v1/<fleet>/<device>/cmd          a deploy or rollback command
    edgekit/v1/<fleet>/<device>/cmd/result   progress and the result of each command (and a proof
                                             command's answer: a proof list, a proof file's chunks)

Each JSON payload says which of these it is in its ``schema`` field: ``edgekit/v1/<kind>``.
"""

from __future__ import annotations

TOPIC_ROOT = "edgekit/v1"
#: What a subscriber that wants everything edgekit publishes subscribes to.
EVERYTHING = f"{TOPIC_ROOT}/#"


def topic(fleet: str, device: str, leaf: str) -> str:
    """``edgekit/v1/<fleet>/<device>/<leaf>`` (leaf: ``status``, ``telemetry``, ``cmd``, ``cmd/result`` ...)."""
    return f"{TOPIC_ROOT}/{fleet}/{device}/{leaf}"


def schema(kind: str) -> str:
    """The ``schema`` a payload of this kind carries: ``edgekit/v1/<kind>``."""
    return f"{TOPIC_ROOT}/{kind}"


SCHEMA_TELEMETRY = schema("telemetry")
SCHEMA_STATUS = schema("status")
SCHEMA_LABELS = schema("labels")
SCHEMA_EVENT = schema("event")
SCHEMA_COMMAND = schema("cmd")
SCHEMA_RESULT = schema("cmd-result")
SCHEMA_AGENT = schema("agent")
SCHEMA_PROOF_LIST = schema("proof-list")
SCHEMA_PROOF_CHUNK = schema("proof-chunk")
