#!/usr/bin/env bash
# A single-node Slurm on this machine (Debian's slurmctld, slurmd, munge), for the tests and for
# trying `pgolf verify --executor slurm` without a cluster.
#
#   scripts/slurm_single_node.sh start    # write the config, start munged, slurmctld, slurmd; wait for the node
#   scripts/slurm_single_node.sh status   # exit 0 when the node takes jobs (sinfo shows it idle or mixed)
#   scripts/slurm_single_node.sh stop     # stop the daemons this script started (by their pid files)
#
# Needs root (the daemons run as root; jobs run as the submitting user) and the packages
# `slurmctld slurmd munge slurm-client` (apt-get install -y ...). Exit codes: 0 ready, 3 cannot start
# here (with one line saying why: not root, a package missing, a slurm.conf this script did not
# write, a daemon that would not start), 1 anything else.
#
# The node: this host's name, CPUs=2, RealMemory = MemTotal minus a 2 GiB margin (and a floor),
# one partition `pgolf` (Default). No cgroups (containers often lack them): proctrack/linuxproc and
# task/none. Job states for `sacct` (which submitit polls): accounting without slurmdbd is
# `AccountingStorageType=accounting_storage/none`, and then plain `sacct` answers "accounting storage
# is disabled"; job completion records (`JobCompType=jobcomp/filetxt`) are read by `sacct -c`, so the
# script puts a tiny `sacct` wrapper first on PATH (in $PGOLF_SLURM_DIR/bin) that adds `-c` when
# storage is off. Running jobs do not appear in completion records; submitit treats an unknown state
# as not finished and its result file ends the wait, so the wrapper also asks `squeue` for the ones
# still queued or running. Export PATH="$PGOLF_SLURM_DIR/bin:$PATH" in the shell that submits.
#
# Files: everything under $PGOLF_SLURM_DIR (default /var/tmp/pgolf-slurm): state, spool, logs,
# the completion log; the config at $SLURM_CONF (default /etc/slurm/slurm.conf), marked as ours.
set -euo pipefail

DIR="${PGOLF_SLURM_DIR:-/var/tmp/pgolf-slurm}"
CONF="${SLURM_CONF:-/etc/slurm/slurm.conf}"
MARK="# written by pgolf scripts/slurm_single_node.sh"
PARTITION=pgolf

cannot() { echo "slurm_single_node: cannot start here: $*" >&2; exit 3; }

node_ready() {
  command -v sinfo >/dev/null 2>&1 || return 1
  local st
  st=$(SLURM_CONF="$CONF" sinfo -h -p "$PARTITION" -o '%t' 2>/dev/null | head -1) || return 1
  [[ "$st" == idle* || "$st" == mix* || "$st" == alloc* ]]
}

write_sacct_wrapper() {
  mkdir -p "$DIR/bin"
  cat >"$DIR/bin/sacct" <<EOF
#!/usr/bin/env bash
# $MARK: sacct over the job completion log (no slurmdbd), plus squeue for jobs not yet complete.
export SLURM_CONF="$CONF"
real=/usr/bin/sacct
if ! grep -q '^AccountingStorageType=accounting_storage/none' "$CONF"; then exec "\$real" "\$@"; fi
"\$real" -c "\$@"
rc=\$?
jobs=()
prev=""
for a in "\$@"; do
  if [[ "\$prev" == "-j" ]]; then jobs+=("\$a"); fi
  case "\$a" in --jobs=*) jobs+=("\${a#--jobs=}") ;; esac
  prev="\$a"
done
if ((\${#jobs[@]})); then
  list=\$(IFS=,; echo "\${jobs[*]}")
  # the running ones, in sacct's --parsable2 shape (JobID|State|NodeList), states spelled out
  squeue -h -j "\$list" -o '%i|%T|%N' 2>/dev/null || true
fi
exit \$rc
EOF
  chmod +x "$DIR/bin/sacct"
}

start() {
  [[ $(id -u) == 0 ]] || cannot "not root (slurmctld, slurmd and munged are started as root)"
  for b in slurmctld slurmd munged sbatch sacct squeue sinfo; do
    command -v "$b" >/dev/null 2>&1 || [[ -x "/usr/sbin/$b" ]] \
      || cannot "$b not installed (apt-get install -y slurmctld slurmd munge slurm-client)"
  done
  if [[ -f "$CONF" ]] && ! grep -qF "$MARK" "$CONF"; then
    cannot "$CONF exists and was not written by this script; set SLURM_CONF to another path"
  fi
  mkdir -p "$DIR"/{state,spool,log} /etc/slurm
  write_sacct_wrapper
  if node_ready; then echo "slurm_single_node: already running (partition $PARTITION)"; return 0; fi

  # munge: a key (the package makes one; make one if it is missing), then the daemon as user munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key 2>/dev/null || true
  chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  # (no socket: munged is not running; asking munge then retries for about a minute)
  if [[ ! -S /run/munge/munge.socket.2 ]] || ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --force || cannot "munged would not start"
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null | unmunge >/dev/null 2>&1 || cannot "munge does not answer after starting munged"
  fi

  local host mem_kib mem_mib
  host=$(hostname -s)
  mem_kib=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  mem_mib=$((mem_kib / 1024 - 2048))
  ((mem_mib >= 512)) || mem_mib=512
  cat >"$CONF" <<EOF
$MARK
ClusterName=pgolf
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
ReturnToService=2
MpiDefault=none
SchedulerType=sched/backfill
MinJobAge=600
NodeName=$host CPUs=2 RealMemory=$mem_mib State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF="$CONF"
  /usr/sbin/slurmctld -c || cannot "slurmctld would not start (see $DIR/log/slurmctld.log)"
  /usr/sbin/slurmd || cannot "slurmd would not start (see $DIR/log/slurmd.log)"
  for _ in $(seq 100); do node_ready && break; sleep 0.2; done
  node_ready || cannot "the node did not come up (sinfo: $(sinfo 2>&1 | tail -1); logs in $DIR/log)"
  echo "slurm_single_node: ready (node $host, partition $PARTITION, CPUs=2, RealMemory=${mem_mib}MiB)"
}

stop() {
  for pidf in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
    [[ -s "$pidf" ]] && kill "$(cat "$pidf")" 2>/dev/null || true
  done
  echo "slurm_single_node: stopped slurmd and slurmctld (munged is left running)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) node_ready && echo ready || { echo "not ready"; exit 1; } ;;
  *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
