#!/usr/bin/env bash
# PostgreSQL server binaries for `lorarl tracking serve` (its own private instance) and the tracking-server
# tests. Installs the Debian package when initdb is missing; starts nothing (lorarl starts its own).
set -euo pipefail
if command -v initdb >/dev/null 2>&1 || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "postgres.sh: PostgreSQL is missing; install its server package (Debian: postgresql)" >&2
  exit 1
fi
own_policy=0
if [[ ! -e /usr/sbin/policy-rc.d ]]; then   # keep the package from starting the system cluster
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
rc=0
{ apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql >/tmp/lorarl-postgres-apt.log 2>&1; } || rc=$?
((own_policy)) && rm -f /usr/sbin/policy-rc.d
((rc == 0)) || { tail -20 /tmp/lorarl-postgres-apt.log >&2; exit "$rc"; }
echo "postgres.sh: installed $(compgen -G '/usr/lib/postgresql/*/bin/initdb' | head -1)"
