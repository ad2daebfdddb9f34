"""What a log line or a published message may show of a URL or a video source: no secret.

One place for it, used wherever a broker URL, a source, a download or an ssh target is
logged or published.  ``redact_url`` masks a password in the user part
(``rtsp://admin:***@cam/s1``; a user alone is kept) and the value of every query
parameter that carries a secret (``?token=***``, ``access_token``, ``key``, ``sig``,
``password``, ``X-Amz-Signature`` ...), wherever URLs appear in the text.
``redact_source`` also masks the secret properties of a GStreamer pipeline string
(``user-id=*** user-pw=***``, ``proxy-pw``, ``password=`` ...).  ``without_password``
drops the password from a URL (for a command line that must still name the user).
``warn_secret_on_command_line`` is the one rule for a secret given as an argument: ``ps`` shows
it to every user, so it is warned about (redacted), saying where it belongs instead.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Sequence

MASK = "***"

# scheme://userinfo@ : greedy up to the last "@" before the host, so an unescaped "@" in a
# password is masked whole.  A userinfo never holds "/", whitespace, quotes, "!" (a GStreamer
# link), "?" or "#".
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^/\s\"'!?#]*)@")

# Names whose value is a secret: a query parameter or a GStreamer property.  A name ending in
# one of these after "-" or "_" counts too (access_token, api_key, X-Amz-Signature, client_secret).
_SECRET_WORDS = (
    "token|secret|password|passwd|passphrase|pwd|pw|key|apikey|sig|signature"
    "|credential|credentials|auth|authorization"
)
_SECRET_NAME = rf"(?:[A-Za-z0-9]+[-_])*(?:{_SECRET_WORDS}|pass)"
# Not "pass" for a property: x264enc's pass=quant is an encoding mode.
_SECRET_PROPERTY = rf"(?:[A-Za-z0-9]+[-_])*(?:{_SECRET_WORDS})"
# ?name=value or &name=value (also ";"), up to the next separator, quote or space.
_QUERY = re.compile(rf"(?P<lead>[?&;])(?P<name>{_SECRET_NAME})=(?P<value>[^&#;\s\"'!]*)", re.IGNORECASE)
# A GStreamer property (name=value after a space or at the start): quoted or a bare word.
_PROPERTY = re.compile(
    rf"(?P<lead>^|[\s,])(?P<name>{_SECRET_PROPERTY}|user-id|proxy-id)=(?P<value>\"[^\"]*\"|'[^']*'|[^\s!,]+)",
    re.IGNORECASE,
)


def _mask_userinfo(match: re.Match[str]) -> str:
    info = match["info"]
    if ":" not in info:
        return match[0]  # a user alone: kept, it names who connects
    return f"{match['scheme']}{info.split(':', 1)[0]}:{MASK}@"


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    if not value:
        return match[0]
    quote = value[0] if value[0] in "\"'" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match['lead']}{match['name']}={quote}{MASK}{quote}"


def redact_url(text: str) -> str:
    """``text`` with every URL's password and secret query parameters masked (``***``).

    ``mqtts://cam-1:hunter2@broker:8883`` -> ``mqtts://cam-1:***@broker:8883``;
    ``https://cdn/b.tar.gz?sig=abc&v=2`` -> ``https://cdn/b.tar.gz?sig=***&v=2``.
    Works on a URL and on text holding URLs (a command line, a message).
    """
    return _QUERY.sub(_mask_value, _USERINFO.sub(_mask_userinfo, text))


def redact_source(source: str) -> str:
    """A video source as it may be logged or published: ``redact_url`` plus GStreamer properties.

    ``rtspsrc location=rtsp://admin:pw@cam/s1 user-pw=pw ! ...`` ->
    ``rtspsrc location=rtsp://admin:***@cam/s1 user-pw=*** ! ...``.
    """
    return _PROPERTY.sub(_mask_value, redact_url(source))


def has_secret(text: str) -> bool:
    """Whether ``redact_source`` would mask anything in ``text``."""
    return redact_source(text) != text


def without_password(url: str) -> str:
    """``url`` with the password (not the user) taken out of its user part: ``mqtt://u:p@h`` -> ``mqtt://u@h``."""
    match = _USERINFO.match(url)
    if match is None or ":" not in match["info"]:
        return url
    return f"{match['scheme']}{match['info'].split(':', 1)[0]}@{url[match.end() :]}"


def on_command_line(text: str, argv: Sequence[str] | None = None) -> bool:
    """Whether ``text`` holds a secret and is on this process's command line (``ps`` shows it to everyone)."""
    return has_secret(text) and any(text in arg for arg in (sys.argv if argv is None else argv))


def warn_secret_on_command_line(
    text: str,
    what: str,
    instead: str,
    *,
    argv: Sequence[str] | None = None,
    logger: logging.Logger | None = None,
) -> bool:
    """Warn when ``text`` holds a secret and is on our command line; whether it did.

    ``what`` names the secret, up to the text (``the MQTT password in``), ``instead`` where it belongs
    (an environment variable, a credential file).  The warning shows ``text`` redacted.  Every
    command that takes a URL, a source or a password goes through here, so the rule (warn,
    never refuse: a first try on a laptop may use it) and the words are the same everywhere.
    """
    if not on_command_line(text, argv):
        return False
    (logger or logging.getLogger(__name__)).warning(
        "%s %s is on the command line, where ps and /proc/<pid>/cmdline show it to every user of this machine; %s",
        what, redact_source(text), instead,
    )  # fmt: skip
    return True
