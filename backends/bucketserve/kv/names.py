"""Short, valid POSIX shared-memory names for the segments one run creates."""

from __future__ import annotations

import re
import secrets

# macOS caps POSIX shm names at 31 characters (PSHMNAMLEN); Linux allows 255. Staying under the
# smaller limit keeps names portable and `ls /dev/shm` readable.
MAX_SHM_NAME_LEN = 31
_TOKEN = re.compile(r"[A-Za-z0-9]+")


def new_run_id() -> str:
    """Return a fresh 8-hex-digit run id, unique enough to keep concurrent runs apart."""
    return secrets.token_hex(4)


def shm_name(run_id: str, role: str, index: int, kind: str) -> str:
    """Return the shm name of one segment, e.g. ("1a2b3c4d", "prefill", 0, "kv") -> "bs_1a2b3c4d_p0_kv"."""
    for field, value in (("run_id", run_id), ("role", role), ("kind", kind)):
        if not _TOKEN.fullmatch(value):
            raise ValueError(f"{field}={value!r} must be non-empty and alphanumeric")
    if index < 0:
        raise ValueError(f"index={index} must be >= 0")
    name = f"bs_{run_id}_{role[0]}{index}_{kind}"
    if len(name) > MAX_SHM_NAME_LEN:
        raise ValueError(
            f"shm name {name!r} has {len(name)} characters, limit {MAX_SHM_NAME_LEN}: "
            "shorten run_id or kind"
        )
    return name
