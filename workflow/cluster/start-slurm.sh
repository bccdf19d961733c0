#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for running the pipeline through
# `snakemake --workflow-profile workflow/profiles/slurm` (see README, "Run on a cluster").
#
#   workflow/cluster/start-slurm.sh                 # install if needed, configure, start, wait until the node is up
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
# file names a live process of that name started for this directory is left alone. A start that fails (or is
# interrupted) stops the daemons it launched and names the daemon that failed and its log. Clients need
# `export SLURM_CONF=$LARGEPROMPT_SLURM_DIR/etc/slurm.conf` (printed at the end). Jobs run as root
# (SlurmUser=root); the partition is `cpu`, the account `largeprompt`.
set -euo pipefail

BASE=${LARGEPROMPT_SLURM_DIR:-/tmp/largeprompt-slurm}
PORT=${LARGEPROMPT_SLURM_PORT:-16800}
CLUSTER=largeprompt
ACCOUNT=largeprompt
PARTITION=cpu
PACKAGES=(slurm-wlm slurmdbd munge mariadb-server)
BINARIES=(/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmdbd /usr/sbin/munged /usr/bin/munge /usr/sbin/mariadbd
    /usr/bin/mariadb-install-db /usr/bin/sbatch /usr/bin/sacct /usr/bin/sacctmgr)
export SLURM_CONF=$BASE/etc/slurm.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

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

# --- processes -----------------------------------------------------------------------------------------
# A daemon is launched as `setsid <daemon> &`: between the fork and the exec, the pid in run/<name>.pid is
# still a bash subshell or setsid, not yet <name>. On a loaded machine that lasts long enough for a check of
# the command name alone to call a daemon dead that comes up a moment later, so the daemons launched by this
# invocation count as alive by pid liveness until they have exec'd (or EXEC_GRACE s have passed).
EXEC_GRACE=30
declare -A LAUNCHED_PID=() LAUNCHED_AT=() LAUNCHED_EPOCH=() # daemon name -> its pid, $SECONDS and the time (s since 1970) at its launch
LAUNCHED=()                               # the daemons this invocation launched, in launch order

# comm_of, running, our_daemon
# shellcheck source=daemon-procs.sh
source "$HERE/daemon-procs.sh"

recorded_pid() { # recorded_pid <name>: the pid in run/<name>.pid
    local pid
    pid=$(cat "$BASE/run/$1.pid" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && echo "$pid"
}

# alive <name>: run/<name>.pid names a live <name> of this cluster, or one this invocation launched that is
# still exec'ing.
alive() {
    local name=$1 pid
    pid=$(recorded_pid "$name") || return 1
    if [[ ${LAUNCHED_PID[$name]:-} == "$pid" && $(comm_of "$pid") != "$name" ]] &&
        ((SECONDS - LAUNCHED_AT[$name] < EXEC_GRACE)); then
        running "$pid" # our own child, not yet exec'd: only its liveness tells
        return
    fi
    our_daemon "$name" "$pid"
}

# remove_stale <name>: the pid file and socket a killed earlier instance may have left (stop-slurm.sh removes
# them, a SIGKILL or a reboot does not), so that none of them is taken for the new daemon's.
remove_stale() {
    rm -f "$BASE/run/$1.daemon.pid"
    case $1 in
    munged) rm -f "$BASE/run/munge.socket" "$BASE/run/munge.socket.lock" ;;
    mariadbd) rm -f "$BASE/run/mysqld.sock" "$BASE/run/mysqld.sock.lock" ;;
    esac
}

# Start "$@" detached, in the foreground mode of the daemon, and record its pid in run/<name>.pid.
launch() {
    local name=$1
    shift
    if alive "$name"; then
        say "$name already running (pid $(recorded_pid "$name"))"
        return 0
    fi
    remove_stale "$name"
    setsid "$@" </dev/null >>"$BASE/log/$name.out" 2>&1 &
    LAUNCHED_PID[$name]=$! LAUNCHED_AT[$name]=$SECONDS LAUNCHED_EPOCH[$name]=$EPOCHSECONDS
    LAUNCHED+=("$name")
    echo $! >"$BASE/run/$name.pid"
    say "started $name (pid $!)"
}

# failed <name> <what>: show the end of the daemon's logs and fail, naming the daemon and its logs (the EXIT
# trap then stops what this invocation started).
failed() {
    local name=$1 log logs=()
    for log in "$BASE/log/$name.log" "$BASE/log/$name.out"; do
        [[ -e $log ]] || continue
        logs+=("$log")
        [[ -s $log ]] && { echo "--- end of $log:" && tail -n 10 "$log"; } >&2
    done
    local IFS=,
    die "$name $2; its logs: ${logs[*]:-none written}"
}

# wait_for <daemon> <seconds> <readiness command...>: until the command succeeds. Fails as soon as the
# daemon has exited, or when the deadline has passed (generous: on a loaded 2-core machine MariaDB's first
# start and slurmdbd's table creation take tens of seconds).
wait_for() {
    local name=$1 limit=$2 deadline=$((SECONDS + $2))
    shift 2
    until "$@" >/dev/null 2>&1; do
        alive "$name" || failed "$name" "exited before it was ready"
        ((SECONDS < deadline)) || failed "$name" "not ready after $limit s"
        sleep 0.5
    done
}

# A failed or interrupted start stops the daemons it launched (newest first, through stop-slurm.sh, which
# also removes their sockets and pid files and the /etc/slurm/slurm.conf symlink), so no half-started
# cluster is left behind. Daemons that were already running before it are left alone.
on_exit() {
    local rc=$? name pid
    trap - EXIT
    ((rc != 0)) || return 0
    say "start failed: stopping what it started (${LAUNCHED[*]:-nothing})" >&2
    for name in "${LAUNCHED[@]}"; do # one still exec'ing is no <name> yet for stop-slurm.sh: kill it here
        pid=${LAUNCHED_PID[$name]}
        if running "$pid" && [[ $(comm_of "$pid") != "$name" ]]; then kill -KILL "$pid" 2>/dev/null || true; fi
    done
    LARGEPROMPT_SLURM_DIR=$BASE bash "$HERE/stop-slurm.sh" --only "${LAUNCHED[@]}" >&2 || true
    exit "$rc"
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

sql() { /usr/bin/mariadb --no-defaults --connect-timeout=10 -S "$BASE/run/mysqld.sock" -uroot -e "$1"; }

start_database() {
    if [[ ! -d $BASE/mysql/mysql ]]; then
        /usr/bin/mariadb-install-db --no-defaults --datadir="$BASE/mysql" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >>"$BASE/log/mariadb-install.out" 2>&1
    fi
    launch mariadbd /usr/sbin/mariadbd --no-defaults --datadir="$BASE/mysql" --user=root \
        --socket="$BASE/run/mysqld.sock" --port=$((PORT + 6)) --bind-address=127.0.0.1 --skip-name-resolve \
        --pid-file="$BASE/run/mariadbd.daemon.pid" --log-error="$BASE/log/mariadbd.log" \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --skip-log-bin
    wait_for mariadbd 300 sql "SELECT 1"
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

# node_up: the node takes jobs: idle, or running or finishing jobs (mix, alloc, comp: a slurmd restarted under a
# running job, e.g. after a crash, finds the node allocated, never idle); a trailing "*" (not responding) or any
# other state (down, drain, unknown) is not up. When this invocation launched slurmd, the node must also have
# registered with that slurmd (SlurmdStartTime not older than the launch): until then sinfo still shows the state
# the controller had from the slurmd that died.
node_up() {
    local state started
    state=$(/usr/bin/sinfo -h -n localhost -o %t 2>/dev/null) || return 1
    [[ $state =~ ^(idle|mix|alloc|comp)$ ]] || return 1
    [[ -n ${LAUNCHED_EPOCH[slurmd]:-} ]] || return 0
    started=$(/usr/bin/scontrol show node localhost 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*') || return 1
    started=$(date -d "${started#*=}" +%s 2>/dev/null) || return 1
    ((started >= LAUNCHED_EPOCH[slurmd]))
}

# ReturnToService=2 should make the node up once slurmd has registered; resume it once if it is not.
wait_node_up() {
    local deadline=$((SECONDS + 180)) resume_at=$((SECONDS + 20))
    until node_up; do
        alive slurmd || failed slurmd "exited before node localhost was up"
        alive slurmctld || failed slurmctld "exited before node localhost was up"
        ((SECONDS < deadline)) || failed slurmd "started, but node localhost is not up after 180 s: $(/usr/bin/sinfo -h -N -o '%N %t %E' 2>&1)"
        if ((resume_at && SECONDS >= resume_at)); then
            /usr/bin/scontrol update nodename=localhost state=resume 2>/dev/null || true
            resume_at=0
        fi
        sleep 0.5
    done
}

munge_ready() { /usr/bin/munge -n --socket="$BASE/run/munge.socket" >/dev/null; }

main() {
    install_packages
    [[ ${1:-} == --install-only ]] && return 0
    [[ $(id -u) == 0 ]] || die "run as root (the daemons run as root and jobs run as root)"
    trap on_exit EXIT
    trap 'exit 129' HUP # a signal ends the script through on_exit too
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mkdir -p "$BASE"/{etc,run,log,state,spool,mysql}
    chmod 755 "$BASE" "$BASE"/{etc,run,log,state,spool}
    if ! alive slurmctld && ! alive slurmdbd; then write_configs; fi
    link_default_config

    [[ -s $BASE/etc/munge.key ]] || /usr/sbin/mungekey -c -k "$BASE/etc/munge.key"
    chmod 600 "$BASE/etc/munge.key"
    launch munged /usr/sbin/munged --foreground --force --socket="$BASE/run/munge.socket" \
        --key-file="$BASE/etc/munge.key" --pid-file="$BASE/run/munged.daemon.pid" \
        --log-file="$BASE/log/munged.log" --seed-file="$BASE/run/munged.seed"
    wait_for munged 60 munge_ready

    start_database
    launch slurmdbd /usr/sbin/slurmdbd -D # reads slurmdbd.conf next to $SLURM_CONF
    wait_for slurmdbd 180 /usr/bin/sacctmgr -n list cluster
    register_accounts

    launch slurmctld /usr/sbin/slurmctld -D -f "$SLURM_CONF"
    wait_for slurmctld 180 /usr/bin/scontrol ping
    launch slurmd /usr/sbin/slurmd -D -N localhost -f "$SLURM_CONF"
    wait_node_up
    /usr/bin/sinfo
    say "ready: partition $PARTITION, account $ACCOUNT"
    echo "export SLURM_CONF=$SLURM_CONF"
}

main "$@"
