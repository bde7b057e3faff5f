"""Load a local page in headless Debian chromium over the DevTools protocol (--remote-debugging-pipe:
NUL-separated JSON on fds 3/4; no network, no extra package) and report what a user would see
broken: console errors, exceptions, failed loads, and each image's naturalWidth."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def chromium() -> str | None:
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


class Pipe:
    def __init__(self, binary: str, profile: str):
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # chromium reads commands on fd 3 and writes replies on fd 4
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(to_r, 3), os.dup2(from_w, 4)))
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self.read(timeout)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})

    def read(self, timeout: float) -> dict:
        end = time.time() + timeout
        while b"\0" not in self._buf:
            left = end - time.time()
            if left <= 0 or not select.select([self._from_r], [], [], left)[0]:
                raise TimeoutError("no reply from chromium")
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        m = json.loads(raw)
        if "method" in m:
            self.events.append(m)
        return m

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        for m in self.events:
            if m["method"] == method:
                return m
        end = time.time() + timeout
        while time.time() < end:
            m = self.read(end - time.time())
            if m.get("method") == method:
                return m
        raise TimeoutError(method)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def load_page(path: Path, binary: str) -> dict:
    """{"images": [{alt, naturalWidth, complete}], "errors": [...], "requests": [urls]}."""
    with tempfile.TemporaryDirectory() as profile:
        pipe = Pipe(binary, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                pipe.send(f"{domain}.enable", session=sid)
            pipe.events.clear()
            pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=sid)
            pipe.wait_event("Page.loadEventFired")
            res = pipe.send("Runtime.evaluate", {"expression": "JSON.stringify(Array.from(document.images).map("
                                                 "i => ({alt: i.alt, naturalWidth: i.naturalWidth, complete: i.complete})))",
                                                 "returnByValue": True}, session=sid)
            images = json.loads(res["result"]["value"])
            errors = []
            for e in pipe.events:
                p = e.get("params", {})
                if e["method"] == "Runtime.exceptionThrown":
                    errors.append(p["exceptionDetails"].get("text", "exception"))
                elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    errors.append(str(p.get("args")))
                elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                    errors.append(p["entry"].get("text", ""))
                elif e["method"] == "Network.loadingFailed":
                    errors.append("load failed: " + p.get("errorText", ""))
            requests = [e["params"]["request"]["url"] for e in pipe.events if e["method"] == "Network.requestWillBeSent"]
            return {"images": images, "errors": errors, "requests": requests}
        finally:
            pipe.close()
