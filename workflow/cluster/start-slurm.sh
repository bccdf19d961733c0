#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for running the pipeline through
# `snakemake --workflow-profile workflow/profiles/slurm` (see README, "Run on a cluster").
#
#   workflow/cluster/start-slurm.sh                 # install if needed, configure, start, wait for an idle node
#   workflow/cluster/start-slurm.sh --install-only  # only the apt-get install (CI)
#   workflow/cluster/stop-slurm.sh [--purge]        # stop what this script started
#
# Debian packages (installed with apt-get when missing; needs root): slurm-wlm 22.05 (slurmctld,
# slurmd, client), slurmdbd, munge, mariadb-server. slurmdbd + MariaDB give real accounting, so
# `sacct` works and the executor plugin checks job states the way it does on a production cluster.
#
# Everything lives under $LARGEPROMPT_SLURM_DIR (default /tmp/largeprompt-slurm): its own munge key
# and socket, its own MariaDB instance on 127.0.0.1, its own ports (base $LARGEPROMPT_SLURM_PORT,
# default 16800: MariaDB +6, slurmctld +17, slurmd +18, slurmdbd +19) and pid files under run/. The one
# thing outside it is /etc/slurm/slurm.conf, a symlink to its slurm.conf (srun inside jobs needs it; see
# link_default_config); /etc/munge and a system MariaDB are never touched. Idempotent: a daemon whose pid
# file names a live process of that name started for this directory is left alone. Clients need
# `export SLURM_CONF=$LARGEPROMPT_SLURM_DIR/etc/slurm.conf` (printed at the end). Jobs run as root
# (SlurmUser=root); the partition is `cpu`, the account `largeprompt`.
set -euo pipefail

BASE=${LARGEPROMPT_SLURM_DIR:-/tmp/largeprompt-slurm}
PORT=${LARGEPROMPT_SLURM_PORT:-16800}
CLUSTER=largeprompt
ACCOUNT=largeprompt
PARTITION=cpu
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
BINARIES=(/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmdbd /usr/sbin/munged /usr/sbin/mariadbd
    /usr/bin/mariadb-install-db /usr/bin/sbatch /usr/bin/sacct /usr/bin/sacctmgr)
export SLURM_CONF=$BASE/etc/slurm.conf

say() { echo "start-slurm: $*"; }
die() {
    echo "start-slurm: error: $*" >&2
    exit 1
}

install_packages() {
    local missing=0 bin
    for bin in "${BINARIES[@]}"; do [[ -x $bin ]] || missing=1; done
    ((missing)) || {
        say "packages present"
        return 0
    }
    [[ $(id -u) == 0 ]] || die "SLURM is not installed; run as root to apt-get install ${PACKAGES[*]}"
    command -v apt-get >/dev/null || die "SLURM is not installed and apt-get is not available"
    # Keep the packages' init scripts from starting system daemons (Debian's policy-rc.d mechanism,
    # as in Docker images): the system slurmctld would fail without /etc/slurm/slurm.conf.
    local policy=/usr/sbin/policy-rc.d added=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    say "apt-get install ${PACKAGES[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
    if ((added)); then
        rm -f "$policy"
        trap - EXIT
    fi
}

# alive <name>: run/<name>.pid names a live <name> that this script started for $BASE (the pid's command
# name and its SLURM_CONF are checked, so a recycled pid is never taken for ours).
alive() {
    local pid
    pid=$(cat "$BASE/run/$1.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] || return 1
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"
}

# Start "$@" detached, in the foreground mode of the daemon, and record its pid in run/<name>.pid.
launch() {
    local name=$1
    shift
    if alive "$name"; then
        say "$name already running (pid $(cat "$BASE/run/$name.pid"))"
        return 0
    fi
    setsid "$@" </dev/null >>"$BASE/log/$name.out" 2>&1 &
    echo $! >"$BASE/run/$name.pid"
    say "started $name (pid $!)"
}

wait_for() { # wait_for <daemon> <seconds> <readiness command...>
    local name=$1 deadline=$((SECONDS + $2))
    shift 2
    while ((SECONDS < deadline)); do
        "$@" >/dev/null 2>&1 && return 0
        alive "$name" || break
        sleep 0.5
    done
    tail -n 5 "$BASE/log/$name".* >&2 || true
    die "$name not ready; logs in $BASE/log"
}

write_configs() {
    # The node as slurmd sees it (CPUs, sockets, cores, threads, RealMemory), renamed to localhost.
    local hw
    hw=$(/usr/sbin/slurmd -C | head -1 | sed -E 's/^NodeName=[^ ]+ //; s/ UpTime=.*//')
    cat >"$BASE/etc/slurm.conf" <<EOF
# Written by workflow/cluster/start-slurm.sh: one node (this machine) as localhost.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$((PORT + 17))
SlurmdPort=$((PORT + 18))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$BASE/run/munge.socket
CredType=cred/munge
StateSaveLocation=$BASE/state
SlurmdSpoolDir=$BASE/spool
SlurmctldPidFile=$BASE/run/slurmctld.daemon.pid
SlurmdPidFile=$BASE/run/slurmd.daemon.pid
SlurmctldLogFile=$BASE/log/slurmctld.log
SlurmdLogFile=$BASE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT + 19))
AccountingStoragePass=$BASE/run/munge.socket
AccountingStorageEnforce=associations
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
EnforcePartLimits=ALL
MinJobAge=300
KillWait=5
InactiveLimit=0
DisableRootJobs=NO
NodeName=localhost NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=$PARTITION Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    local pass
    pass=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    (
        umask 077
        cat >"$BASE/etc/slurmdbd.conf" <<EOF
# Written by workflow/cluster/start-slurm.sh
AuthType=auth/munge
AuthInfo=socket=$BASE/run/munge.socket
DbdHost=localhost
DbdPort=$((PORT + 19))
SlurmUser=root
PidFile=$BASE/run/slurmdbd.daemon.pid
LogFile=$BASE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((PORT + 6))
StorageUser=slurm
StoragePass=$pass
StorageLoc=largeprompt_acct_db
EOF
    )
}

# The executor's job step (snakemake-executor-plugin-slurm-jobstep) calls srun with every SLURM_*
# variable removed, SLURM_CONF included, so srun reads the compiled-in /etc/slurm/slurm.conf: make that
# a symlink to ours. A slurm.conf that is not our symlink (a real cluster's) is never replaced.
link_default_config() {
    local default=/etc/slurm/slurm.conf
    if [[ -L $default && $(readlink "$default") == "$SLURM_CONF" ]]; then return 0; fi
    [[ ! -e $default && ! -L $default ]] || die "$default exists and is not this cluster's; not replacing it"
    mkdir -p /etc/slurm
    ln -s "$SLURM_CONF" "$default"
}

sql() { /usr/bin/mariadb --no-defaults -S "$BASE/run/mysqld.sock" -uroot -e "$1"; }

start_database() {
    if [[ ! -d $BASE/mysql/mysql ]]; then
        /usr/bin/mariadb-install-db --no-defaults --datadir="$BASE/mysql" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >>"$BASE/log/mariadb-install.out" 2>&1
    fi
    launch mariadbd /usr/sbin/mariadbd --no-defaults --datadir="$BASE/mysql" --user=root \
        --socket="$BASE/run/mysqld.sock" --port=$((PORT + 6)) --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$BASE/run/mariadbd.daemon.pid" --log-error="$BASE/log/mariadbd.log" \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --skip-log-bin
    wait_for mariadbd 60 sql "SELECT 1"
    local pass
    pass=$(sed -n 's/^StoragePass=//p' "$BASE/etc/slurmdbd.conf")
    sql "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
         ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
         GRANT ALL ON largeprompt_acct_db.* TO 'slurm'@'127.0.0.1';"
}

# The cluster, an account and root as its user, so `slurm_account: largeprompt` passes the
# executor plugin's sacctmgr check and AccountingStorageEnforce=associations.
register_accounts() {
    /usr/bin/sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
    if ! /usr/bin/sacctmgr -n -P list account "$ACCOUNT" format=account | grep -qx "$ACCOUNT"; then
        /usr/bin/sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" Description="largeprompt pipeline" Organization=largeprompt >/dev/null
    fi
    if ! /usr/bin/sacctmgr -n -P list assoc user=root account="$ACCOUNT" format=account | grep -qx "$ACCOUNT"; then
        /usr/bin/sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null
    fi
}

node_idle() { [[ $(/usr/bin/sinfo -h -n localhost -o %t 2>/dev/null) == idle ]]; }

main() {
    install_packages
    [[ ${1:-} == --install-only ]] && return 0
    [[ $(id -u) == 0 ]] || die "run as root (the daemons run as root and jobs run as root)"
    mkdir -p "$BASE"/{etc,run,log,state,spool,mysql}
    chmod 755 "$BASE" "$BASE"/{etc,run,log,state,spool}
    if ! alive slurmctld && ! alive slurmdbd; then write_configs; fi
    link_default_config

    [[ -s $BASE/etc/munge.key ]] || /usr/sbin/mungekey -c -k "$BASE/etc/munge.key"
    chmod 600 "$BASE/etc/munge.key"
    launch munged /usr/sbin/munged --foreground --force --socket="$BASE/run/munge.socket" \
        --key-file="$BASE/etc/munge.key" --pid-file="$BASE/run/munged.daemon.pid" \
        --log-file="$BASE/log/munged.log" --seed-file="$BASE/run/munged.seed"
    wait_for munged 20 test -S "$BASE/run/munge.socket"

    start_database
    launch slurmdbd /usr/sbin/slurmdbd -D # reads slurmdbd.conf next to $SLURM_CONF
    wait_for slurmdbd 60 /usr/bin/sacctmgr -n list cluster
    register_accounts

    launch slurmctld /usr/sbin/slurmctld -D -f "$SLURM_CONF"
    wait_for slurmctld 60 /usr/bin/scontrol ping
    launch slurmd /usr/sbin/slurmd -D -N localhost -f "$SLURM_CONF"
    local i
    for ((i = 0; i < 120; i++)); do # ReturnToService=2 should make it idle; resume it once if it is not
        node_idle && break
        ((i != 40)) || /usr/bin/scontrol update nodename=localhost state=resume 2>/dev/null || true
        sleep 0.5
    done
    node_idle || die "node localhost is not idle after 60 s: $(/usr/bin/sinfo -h -N -o '%N %t %E' 2>&1); logs in $BASE/log"
    /usr/bin/sinfo
    say "ready: partition $PARTITION, account $ACCOUNT"
    echo "export SLURM_CONF=$SLURM_CONF"
}

main "$@"
