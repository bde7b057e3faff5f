"""Credentials of a tracking server with MLflow's basic auth: a `key = value` file only its owner can read
(default ~/.config/lorarl/tracking-credentials, `$LORARL_TRACKING_CREDENTIALS` or the profile's
`tracking_credentials:` name another). `lorarl tracking serve` creates it (random password, mode 0600);
a job reads it and hands user and password to MLflow's REST client of that server inside the process,
never through its environment or command line (children and `ps e` never see them).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lorarl.tracking.errors import TrackingError

CREDENTIALS_ENV = "LORARL_TRACKING_CREDENTIALS"  # path of the credentials file (never the secret itself)
DEFAULT_CREDENTIALS = "~/.config/lorarl/tracking-credentials"


def credentials_path(path: str | Path | None = None) -> Path:
    return Path(os.path.expanduser(str(path or os.environ.get(CREDENTIALS_ENV) or DEFAULT_CREDENTIALS)))


def load_credentials(path: str | Path | None = None) -> dict[str, str] | None:
    """{'username', 'password'} from `key = value` lines; None if the file does not exist. Refused
    (TrackingError) when group or others may read it, or another user owns it."""
    p = credentials_path(path)
    if not p.exists():
        return None
    st = p.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO) or st.st_uid != os.getuid():
        raise TrackingError(f"tracking credentials {p}: must be owned by you and readable only by you "
                            f"(mode {stat.S_IMODE(st.st_mode):o}); run `chmod 600 {p}`")
    out = {}
    for line in p.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    if not out.get("username") or not out.get("password"):
        raise TrackingError(f"tracking credentials {p}: needs `username = ...` and `password = ...` lines")
    return out


def write_credentials(path: str | Path | None = None, username: str = "lorarl") -> dict[str, str]:
    """Create the credentials file (random password, mode 0600 from the start) unless it exists."""
    p = credentials_path(path)
    found = load_credentials(p)
    if found:
        return found
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    creds = {"username": username, "password": secrets.token_urlsafe(24)}
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"# MLflow basic-auth credentials of `lorarl tracking serve` (keep mode 0600)\n"
                 f"username = {creds['username']}\npassword = {creds['password']}\n")
    return creds


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_client(uri: str, path: str | Path | None = None) -> None:
    """In the launcher, before anything is submitted: a server beyond loopback needs a private credentials file."""
    if os.environ.get("MLFLOW_TRACKING_TOKEN") or os.environ.get("MLFLOW_TRACKING_USERNAME"):
        return
    if load_credentials(path) is None and not is_loopback(urlparse(uri).hostname or ""):
        raise TrackingError(f"tracking: {uri} is beyond loopback, so it needs the credentials file "
                            f"{credentials_path(path)} (written by `lorarl tracking serve`; or set ${CREDENTIALS_ENV})")


def configure_client(uri: str) -> None:
    """In a job: the credentials file's user and password go to MLflow's REST client of this server only
    (a store builder of this process), never into os.environ (children would inherit them, `ps e` would
    show them); MLflow's HTTP retries off (ours back off). Explicit MLFLOW_TRACKING_* variables win."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    if os.environ.get("MLFLOW_TRACKING_TOKEN") or os.environ.get("MLFLOW_TRACKING_USERNAME"):
        return
    creds = load_credentials()
    if creds:
        _use_credentials(uri, creds)
    elif not is_loopback(urlparse(uri).hostname or ""):
        raise TrackingError(f"tracking: {uri} is beyond loopback, so it needs the credentials file "
                            f"{credentials_path()} (written by `lorarl tracking serve`; or set ${CREDENTIALS_ENV})")


def _use_credentials(uri: str, creds: dict[str, str]) -> None:
    """Register http/https store builders whose host credentials carry `creds` for `uri`'s host:port only."""
    from functools import partial

    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.tracking._tracking_service import utils as store_utils
    from mlflow.utils.credentials import get_default_host_creds

    netloc = urlparse(uri).netloc

    def host_creds(store_uri: str) -> Any:
        found = get_default_host_creds(store_uri)
        if urlparse(store_uri).netloc == netloc and not found.token:
            found.username, found.password = creds["username"], creds["password"]
        return found

    def rest_store(store_uri: str, **_: Any) -> RestStore:
        return RestStore(partial(host_creds, store_uri))

    registry = store_utils._tracking_store_registry
    for scheme in ("http", "https"):
        registry.register(scheme, rest_store)
    cached = getattr(type(registry), "_get_store_with_resolved_uri", None)
    if hasattr(cached, "cache_clear"):  # a store built before this call would lack the credentials
        cached.cache_clear()
