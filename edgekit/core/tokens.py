"""A bearer token read from a file or the environment: the one rule of every edgekit listener and client.

``edgekit fleet serve`` reads its dashboard token (``--token-file`` / ``EDGEKIT_FLEET_TOKEN``)
and its artifact port's download token (``--artifact-token-file`` / ``EDGEKIT_ARTIFACT_TOKEN``)
this way; ``edgekit agent run`` and ``edgekit deploy --fleet`` read the download token the same
way to send it.  Here, below the fleet package, so that a device reads it without the fleet's
dependencies.  A file must not be readable by other users; a token is 16 or more printable
characters without spaces.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from edgekit.errors import EdgekitError

TOKEN_ENV = "EDGEKIT_FLEET_TOKEN"
ARTIFACT_TOKEN_ENV = "EDGEKIT_ARTIFACT_TOKEN"
MIN_TOKEN = 16
MAKE_ONE = "make one: python -c 'import secrets; print(secrets.token_urlsafe(32))' > fleet.token; chmod 600 fleet.token"


def read_token(token_file: Path | None, env: str = TOKEN_ENV, flag: str = "--token-file") -> str | None:
    """The token from ``token_file``, else ``$env``, else None; refused when too short or readable by others."""
    if token_file is not None:
        try:
            st = token_file.stat()
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise EdgekitError(f"cannot read {flag} {token_file}: {err}", MAKE_ONE) from err
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EdgekitError(
                f"{flag} {token_file} can be read by other users",
                f"chmod 600 {token_file}",
            )
        token, where = text.strip(), f"{flag} {token_file}"
    elif os.environ.get(env):
        token, where = os.environ[env].strip(), f"${env}"
    else:
        return None
    if len(token) < MIN_TOKEN or any(c.isspace() or not c.isprintable() for c in token):
        raise EdgekitError(
            f"the token in {where} is not usable: {MIN_TOKEN} or more printable characters, no spaces",
            MAKE_ONE,
        )
    return token
