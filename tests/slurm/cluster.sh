#!/usr/bin/env bash
# A real Slurm cluster (slurmctld + slurmd + slurmdbd/mariadb + munge) on this host, for the
# `slurm`-marked tests.  Debian 12, root, no systemd.
#
# Two nodes: this host ($HOST: partitions cpu and gpu) and a second slurmd ($NODE2) started in its own
# UTS namespace (`unshare --uts`: its own hostname, so slurmd takes it for that node; its own slurmd
# port) on the same machine; partition `multi` = both, for jobs of several nodes. Slurm 22.05 as
# packaged is not built with --enable-multiple-slurmd, hence the namespace. $NODE2 resolves to
# 127.0.0.1 (a line added to /etc/hosts), as a job's rendezvous on its first node needs.
#
#   bash tests/slurm/cluster.sh up|down|status|heal
#
# `heal` (after a fault test stopped a daemon): restarts whichever of munged, mariadb, slurmdbd,
# slurmctld, slurmd is not running, keeping their state and jobs, and resumes the node if it is down
# or drained.
#
# State (configs, pids, logs, spool, database) lives in $LORARL_SLURM_DIR
# (default /tmp/lorarl-slurm).  The configs are also symlinked into /etc/slurm,
# because that is where every Slurm client (sbatch, sacct, ... and submitit,
# and the jobs themselves) looks when SLURM_CONF is not set.
set -Eeuo pipefail
trap 'echo "cluster.sh: ERROR: \`$BASH_COMMAND\` failed (line $LINENO)" >&2' ERR

STATE=${LORARL_SLURM_DIR:-/tmp/lorarl-slurm}
ETC=$STATE/etc RUN=$STATE/run LOG=$STATE/log SPOOL=$STATE/spool
DB_DATA=$STATE/mysql-data DB_RUN=$STATE/mysqld    # both owned by `mysql`
DB_TMP=$STATE/mysql-tmp   # mariadb's own tmpdir (owned by `mysql`): the caller's $TMPDIR may not be writable by it
DB_PORT=${LORARL_SLURM_DB_PORT:-13306}              # not 3306: don't clash with a system mariadb
DB_PASS=lorarl-slurm-test                           # local, loopback-only throwaway DB
CLUSTER=lorarl
HOST=$(hostname -s)
NODE2=${LORARL_SLURM_NODE2:-lorarl-node2}          # the second node's name (and hostname in its namespace)
NODE2_PORT=${LORARL_SLURM_NODE2_PORT:-6828}         # its slurmd's port (slurmctld 6817, slurmd 6818, slurmdbd 6819)
PACKAGES=(slurm-wlm munge mariadb-server slurmdbd)

die() { echo "cluster.sh: ERROR: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*"; }

# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.5 s until it succeeds.
wait_for() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.5
  done
}

# running PID: the process exists and is not a zombie. A SIGKILLed daemon is reparented to init, and
# where init reaps late (this VM's init: ~80 s) `kill -0` alone would take its zombie for a live daemon.
running() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; [[ ${s%% *} != Z ]]; }
alive() { [[ -s $1 ]] && running "$(cat "$1")"; }

# close_fds: close every inherited descriptor above 2 in this (sub)shell, so a daemon started from
# it never holds the caller's files for its lifetime (e.g. the fd of `flock -x LOCK cluster.sh up`:
# the lock would stay held until the daemon exits).
close_fds() {
  local f n
  for f in /proc/$BASHPID/fd/*; do
    n=${f##*/}
    if ((n > 2)); then eval "exec $n>&-" 2>/dev/null || true; fi
  done
}

# start NAME CMD...: run a daemon in the foreground of its own session, record its pid.
start() {
  local name=$1; shift
  (close_fds; exec setsid "$@" >>"$LOG/$name.out" 2>&1 </dev/null) &
  echo $! >"$RUN/$name.pid"
}

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  # Keep the packages' maintainer scripts from starting daemons (we start our own).
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed"
  local rc=0
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1 || rc=$?
  if ((own_policy)); then rm -f /usr/sbin/policy-rc.d; fi
  ((rc == 0)) || { tail -20 "$STATE/apt.log" >&2; die "apt-get install failed (see $STATE/apt.log)"; }
}

write_configs() {
  # Real CPU topology from slurmd -C; memory minus a margin so jobs with --mem schedule.
  local hw mem
  hw=$(slurmd -C | head -1 | sed -E 's/^NodeName=[^ ]+ //; s/ RealMemory=[0-9]+//')
  mem=$(slurmd -C | sed -nE 's/.*RealMemory=([0-9]+).*/\1/p')
  mem=$((mem * 9 / 10))

  # Fake GPUs: gres File= entries must be device files; symlinks to /dev/null do
  # (a bare Count= without File= makes slurmd drain the node).
  mkdir -p "$STATE/dev"
  ln -sfn /dev/null "$STATE/dev/nvidia0"; ln -sfn /dev/null "$STATE/dev/nvidia1"

  cat >"$ETC/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job gets BeginTime = now + cred_expire + 1 (default 120 s), and is only
# picked up again by the next main-scheduler pass (sched_interval, default 60 s):
# these bring a requeue->restart down to ~12 s.
AuthInfo=cred_expire=10
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
# No systemd/cgroup delegation here: track and launch processes without cgroups.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
MinJobAge=30
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
# sacct (which submitit polls) needs accounting storage, i.e. slurmdbd.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=$HOST $hw RealMemory=$mem Gres=gpu:2 State=UNKNOWN
NodeName=$NODE2 NodeHostname=$NODE2 NodeAddr=127.0.0.1 Port=$NODE2_PORT $hw RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=cpu Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$HOST MaxTime=INFINITE State=UP
PartitionName=multi Nodes=$HOST,$NODE2 MaxTime=INFINITE State=UP
EOF
  cat >"$ETC/gres.conf" <<EOF
NodeName=$HOST,$NODE2 Name=gpu File=$STATE/dev/nvidia[0-1]
EOF
  cat >"$ETC/cgroup.conf" <<EOF
# Unused (no cgroup plugins configured); present so Slurm doesn't look for one.
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
EOF
  cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=$HOST
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ETC/slurmdbd.conf"   # slurmdbd refuses a world-readable conf (it holds a password)

  # gres.conf/cgroup.conf/slurmdbd.conf are looked up next to slurm.conf.
  mkdir -p /etc/slurm
  local f
  for f in slurm.conf slurmdbd.conf gres.conf cgroup.conf; do
    if [[ -e /etc/slurm/$f && ! -L /etc/slurm/$f ]]; then mv "/etc/slurm/$f" "/etc/slurm/$f.orig"; fi
    ln -sfn "$ETC/$f" "/etc/slurm/$f"
  done
}

start_munge() {
  # A munged we did not start (e.g. the system's) is used as is, and left running by `down`.
  if alive /run/munge/munged.pid; then log "using the running munged"; return 0; fi
  [[ -s /etc/munge/munge.key ]] || runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  # munged won't run as root; it daemonizes itself and writes /run/munge/munged.pid.
  (close_fds; exec runuser -u munge -- munged) || die "munged failed to start (see /var/log/munge/munged.log)"
  wait_for 10 munge bash -c 'munge -n | unmunge' || die "munge does not work"
  cp /run/munge/munged.pid "$RUN/munged.pid"
}

start_mariadb() {
  mkdir -p "$DB_DATA" "$DB_RUN" "$DB_TMP"
  chown mysql:mysql "$DB_DATA" "$DB_RUN" "$DB_TMP"
  if [[ ! -d $DB_DATA/mysql ]]; then  # mariadb-install-db's bootstrap server writes to $TMPDIR
    TMPDIR=$DB_TMP mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DATA" --skip-test-db \
      >"$LOG/mariadb-install.log" 2>&1 || { tail "$LOG/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
  fi
  start mariadb mariadbd --no-defaults --user=mysql --datadir="$DB_DATA" --tmpdir="$DB_TMP" \
    --socket="$DB_RUN/mysqld.sock" --pid-file="$DB_RUN/mysqld.pid" --log-error="$DB_RUN/error.log" \
    --bind-address=127.0.0.1 --port="$DB_PORT"
  local sql=(mariadb --no-defaults --socket="$DB_RUN/mysqld.sock" -uroot)
  wait_for 30 mariadb "${sql[@]}" -e 'SELECT 1' || { tail "$DB_RUN/error.log" >&2; die "mariadb did not come up"; }
  # Fresh accounting every `up`: job ids restart at 1 with a fresh StateSaveLocation,
  # and old records with the same ids would confuse sacct (and submitit).
  "${sql[@]}" -e "DROP DATABASE IF EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "mariadb setup failed"
}

node_idle() { [[ $(sinfo -h -N -n "$HOST,$NODE2" -o %t 2>/dev/null | sort -u) == idle ]]; }

# The second node: its name resolves here (a job's first node hosts its rendezvous), and its slurmd runs in
# a UTS namespace whose hostname is $NODE2 (slurmd finds its NodeName by hostname), logging to its own file.
start_node2() {
  grep -qE "^127\.0\.0\.1[[:space:]].*\b$NODE2\b" /etc/hosts || echo "127.0.0.1 $NODE2  # lorarl test cluster" >>/etc/hosts
  start slurmd2 unshare --uts sh -c "hostname $NODE2 && exec slurmd -D -L $LOG/slurmd-$NODE2.log"
}

up() {
  [[ $EUID -eq 0 ]] || die "must run as root"
  local t0=$SECONDS
  mkdir -p "$STATE"
  install_packages
  down quiet                          # idempotent: `up` on a running cluster restarts it fresh
  rm -rf "$SPOOL" "$LOG"
  mkdir -p "$ETC" "$RUN" "$LOG" "$SPOOL/ctld" "$SPOOL/d/$HOST" "$SPOOL/d/$NODE2"
  write_configs
  start_munge
  start_mariadb
  start slurmdbd slurmdbd -D
  wait_for 30 slurmdbd sacctmgr -n list cluster || { tail "$LOG/slurmdbd.log" >&2; die "slurmdbd not reachable"; }
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed"
  start slurmctld slurmctld -D -i   # -i: ignore any state left in StateSaveLocation
  wait_for 30 slurmctld scontrol ping || { tail "$LOG/slurmctld.log" >&2; die "slurmctld did not come up"; }
  start slurmd slurmd -D
  start_node2
  if ! wait_for 60 "idle nodes" node_idle; then
    sinfo -N -l >&2 || true; scontrol show node "$HOST,$NODE2" | grep -i reason >&2 || true
    tail "$LOG/slurmd.log" "$LOG/slurmd-$NODE2.log" >&2 || true
    die "nodes $HOST, $NODE2 are not idle"
  fi
  wait_for 30 sacct sacct -n -X || die "sacct does not work (see $LOG/slurmdbd.log)"
  sinfo
  log "cluster up in $((SECONDS - t0)) s (state in $STATE, configs symlinked into /etc/slurm)"
}

# stop PIDFILE...: TERM these daemons together, KILL any still alive after 15 s.
stop() {
  local f pids=() i
  for f in "$@"; do
    if alive "$f"; then pids+=("$(cat "$f")"); kill -TERM "${pids[-1]}" 2>/dev/null || true; fi
    rm -f "$f"
  done
  for i in $(seq 75); do
    local left=0
    for f in "${pids[@]}"; do running "$f" && left=1; done
    ((left)) || return 0
    sleep 0.2
  done
  for f in "${pids[@]}"; do
    if running "$f"; then echo "cluster.sh: pid $f ignored SIGTERM, killing" >&2; kill -KILL "$f" || true; fi
  done
}

down() {
  local quiet=${1:-}
  # Cancel jobs first so no slurmstepd/job processes outlive slurmd.
  if alive "$RUN/slurmctld.pid"; then
    local ids
    ids=$(timeout 10 squeue -h -o %i 2>/dev/null || true)
    if [[ -n $ids ]]; then
      timeout 10 scancel $ids 2>/dev/null || true
      wait_for 15 "jobs gone" bash -c '[[ -z $(squeue -h -o %i) ]]' || true
    fi
  fi
  stop "$RUN/slurmd.pid" "$RUN/slurmd2.pid" "$RUN/slurmctld.pid" "$RUN/slurmdbd.pid"
  stop "$RUN/mariadb.pid" "$RUN/munged.pid"   # after the Slurm daemons, which use them
  [[ -n $quiet ]] || log "cluster down"
}

node_usable() { [[ $(sinfo -h -N -n "$1" -o %t 2>/dev/null | sort -u) =~ ^(idle|mix|alloc|comp)$ ]]; }

heal() {
  [[ $EUID -eq 0 ]] || die "must run as root"
  [[ -s $ETC/slurm.conf ]] || die "no cluster configured in $STATE (bash $0 up)"
  alive "$RUN/munged.pid" || alive /run/munge/munged.pid || start_munge
  if ! alive "$RUN/mariadb.pid"; then
    start mariadb mariadbd --no-defaults --user=mysql --datadir="$DB_DATA" --tmpdir="$DB_TMP" --socket="$DB_RUN/mysqld.sock" \
      --pid-file="$DB_RUN/mysqld.pid" --log-error="$DB_RUN/error.log" --bind-address=127.0.0.1 --port="$DB_PORT"
    wait_for 30 mariadb mariadb --no-defaults --socket="$DB_RUN/mysqld.sock" -uroot -e 'SELECT 1' \
      || die "mariadb did not come up"
  fi
  if ! alive "$RUN/slurmdbd.pid"; then
    log "restarting slurmdbd"; start slurmdbd slurmdbd -D
    wait_for 30 slurmdbd sacctmgr -n list cluster || die "slurmdbd not reachable"
  fi
  if ! alive "$RUN/slurmctld.pid"; then
    log "restarting slurmctld"; start slurmctld slurmctld -D   # no -i: keep its saved jobs
    wait_for 30 slurmctld scontrol ping || die "slurmctld did not come up"
  fi
  if ! alive "$RUN/slurmd.pid"; then log "restarting slurmd"; start slurmd slurmd -D; fi
  if ! alive "$RUN/slurmd2.pid"; then log "restarting slurmd of $NODE2"; start_node2; fi
  local node
  for node in "$HOST" "$NODE2"; do
    if ! wait_for 20 "usable node" node_usable "$node"; then
      log "resuming node $node"; scontrol update nodename="$node" state=resume || true
      wait_for 60 "usable node" node_usable "$node" || die "node $node is not usable: $(sinfo -h -N -o '%N %t %E')"
    fi
  done
  wait_for 30 sacct sacct -n -X || die "sacct does not work (see $LOG/slurmdbd.log)"
  log "cluster healthy"
}

status() {
  local name
  for name in munged mariadb slurmdbd slurmctld slurmd slurmd2; do
    local f=$RUN/$name.pid
    if alive "$f"; then echo "$name: running (pid $(cat "$f"))"; else echo "$name: stopped"; fi
  done
  sinfo && squeue || die "slurmctld not reachable (bash $0 up?)"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  heal) heal ;;
  *) echo "usage: $0 up|down|status|heal" >&2; exit 2 ;;
esac
