#!/usr/bin/env bash
# Install Debian's chromium (headless browser for tests/test_report_browser.py); idempotent:
# does nothing when a chromium binary is already on PATH. Needs root (CI containers run as root).
set -euo pipefail
for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then exit 0; fi
done
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "[chromium] not installed and not root: the browser test will be skipped" >&2; exit 0; fi
else SUDO=""; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
$SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
command -v chromium
