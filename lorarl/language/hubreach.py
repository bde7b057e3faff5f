"""Whether the Hugging Face hub answers, and what it says of one repository: what lorarl.language.hubcheck asks for
a reference that is not in the local cache.

`Probe`: one HTTP request (`HEAD` of `$HF_ENDPOINT`, through the proxy huggingface_hub's client would take) in a
daemon thread, answered within its deadline whatever the network does: a refused connection, a name lookup that
never returns, a firewall, sandbox or proxy that accepts the connection and never answers. A TCP connection alone
is not an answer (such a middlebox accepts every one). `ask`: `model_info` / `dataset_info` of one repository at a
revision, within a deadline too.
"""

from __future__ import annotations

import atexit
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable


def _ask(kind: str, repo: str, revision: str | None, timeout_s: float) -> str:
    """'found', 'missing' (the hub answered: no such repo or revision) or 'unreachable: <why>'."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)
    info = api.model_info if kind == "model" else api.dataset_info
    try:
        info(repo, revision=revision, timeout=timeout_s)
    except GatedRepoError:
        return "found"  # it exists; the job needs a token with access (HF_TOKEN)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        return "missing"
    except HfHubHTTPError as err:
        status = getattr(getattr(err, "response", None), "status_code", None)
        return "missing" if status in (401, 404) else f"unreachable: HTTP {status}"
    except Exception as err:  # noqa: BLE001 - connection refused, DNS, TLS, timeout: all mean "not reachable"
        return "unreachable: no answer" if "Timeout" in type(err).__name__ else f"unreachable: {type(err).__name__}"
    return "found"


def ask(kind: str, repo: str, revision: str | None, timeout_s: float) -> str:
    """`_ask` of a model (`kind` model) or dataset repository within `timeout_s` of wall time, whatever the network
    does (:class:`Bounded`: never waited past it)."""
    return Bounded(lambda: _ask(kind, repo, revision, timeout_s), timeout_s, "unreachable: no answer").result()


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _proxy(url: str) -> str | None:
    """The proxy a connection to `url` goes through, as httpx (huggingface_hub's client) reads the environment:
    HTTP(S)_PROXY for its scheme, else ALL_PROXY, none for a host NO_PROXY names."""
    u = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(u.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(u.netloc, proxies):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is an answer: the probe follows none


def _head(url: str, deadline_s: float) -> str | None:
    """None when something answers `HEAD url` in HTTP (any status), through the proxy the hub client would take,
    else why not. The certificate is not checked: the probe reads nothing, and the questions after it use the hub
    client's TLS settings. Through a proxy urllib cannot speak (socks, or TLS to the proxy itself): a TCP
    connection to the proxy only."""
    proxy = _proxy(url)
    if proxy and not proxy.startswith("http://"):
        p = urllib.parse.urlsplit(proxy)
        try:
            socket.create_connection((p.hostname or "", p.port or 1080), timeout=deadline_s).close()
            return None
        except OSError as err:
            return str(err.strerror or type(err).__name__)
    tls = ssl.create_default_context()
    tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({urllib.parse.urlsplit(url).scheme: proxy} if proxy else {}),
        urllib.request.HTTPSHandler(context=tls), _NoRedirect())
    try:
        opener.open(urllib.request.Request(url, method="HEAD"), timeout=deadline_s).close()
    except urllib.error.HTTPError:
        return None  # a status (401, 404, 3xx, 5xx): something answered; the questions tell what
    except (OSError, ValueError) as err:  # refused, no such name, the proxy's tunnel refused, timed out
        why = getattr(err, "reason", err)
        if isinstance(why, TimeoutError):
            return f"no answer in {deadline_s:g} s"
        return str(getattr(why, "strerror", None) or why or type(err).__name__)
    return None


class Bounded:
    """`fn()` started at once in a daemon thread; `result()` waits for it until `deadline_s` after its start, never
    longer (else `default`). At exit the thread is waited out, at most a second deadline past its own (the socket
    timeouts inside are the deadline per step): a daemon thread still in the network or ssl code while the
    interpreter finalises can crash the exit (a SIGSEGV was seen when a bad study ended `lorarl cells` early)."""

    def __init__(self, fn: Callable[[], Any], deadline_s: float, default: Any) -> None:
        self.deadline_s, self.default = deadline_s, default
        self._end = time.monotonic() + deadline_s
        self._box: list[Any] = []
        self._thread = threading.Thread(target=lambda: self._box.append(fn()), daemon=True)
        self._thread.start()
        atexit.register(self.settle)

    def settle(self) -> None:
        """At exit: wait for the thread to end, at most a deadline past its own."""
        self._thread.join(max(0.0, self._end + self.deadline_s - time.monotonic()))

    def result(self) -> Any:
        self._thread.join(max(0.0, self._end - time.monotonic()))
        return self._box[0] if self._box else self.default


class Probe(Bounded):
    """The one probe of the hub (`_head` of the endpoint), started at once, so that what lists a study probes while
    the study loads (the name lookup is inside the deadline too: a resolver that never answers cannot hold the
    command). `result()`: None when the hub answered one HTTP request (a TCP connection alone is not enough: a
    firewall, sandbox or proxy that accepts connections and never answers is no hub), else why not."""

    def __init__(self, deadline_s: float, url: str | None = None) -> None:
        self.url = url or endpoint()
        super().__init__(lambda: _head(self.url, deadline_s), deadline_s, f"no answer in {deadline_s:g} s")


def reach(url: str, deadline_s: float) -> str | None:
    """`Probe(deadline_s, url).result()`: None when the hub at `url` answers within `deadline_s`, else why not."""
    return Probe(deadline_s, url).result()
