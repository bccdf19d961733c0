#!/usr/bin/env bash
# Stop the single-node cluster of workflow/cluster/start-slurm.sh: cancel its jobs, then stop its daemons,
# newest first, wait until they are really gone and remove their sockets and pid files. Its daemons are the
# processes named slurmd, slurmctld, slurmdbd, mariadbd or munged whose SLURM_CONF is this cluster's (the
# start script exports it to all of them); any other slurmctld, slurmd, munged or MariaDB on the machine
# is left alone.
#
#   workflow/cluster/stop-slurm.sh                 # stop and remove the /etc/slurm/slurm.conf symlink that
#                                                  # start-slurm.sh made; keep configs, accounting and job history
#   workflow/cluster/stop-slurm.sh --purge         # the same, then delete $LARGEPROMPT_SLURM_DIR
#   workflow/cluster/stop-slurm.sh --only NAME...  # stop only these daemons (start-slurm.sh after a failed start)
set -euo pipefail

BASE=${LARGEPROMPT_SLURM_DIR:-/tmp/largeprompt-slurm}
export SLURM_CONF=$BASE/etc/slurm.conf
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DAEMONS=(slurmd slurmctld slurmdbd mariadbd munged) # stop order: newest first
TERM_WAIT=60                                        # seconds a daemon gets to shut down before SIGKILL
KILL_WAIT=15                                        # seconds to wait for it to vanish after SIGKILL

say() { echo "stop-slurm: $*"; }
warn() { echo "stop-slurm: error: $*" >&2; }

# comm_of, running, our_daemon
# shellcheck source=daemon-procs.sh
source "$HERE/daemon-procs.sh"

# pids_of <name>: every running <name> of this cluster. All of /proc is searched, not only run/<name>.pid,
# so a daemon whose pid file was lost (a start interrupted right after the launch) is found too.
pids_of() {
    local dir comm
    for dir in /proc/[0-9]*; do
        comm=""
        { read -r comm <"$dir/comm"; } 2>/dev/null || continue # read here, not with comm_of: no fork per process
        if [[ $comm == "$1" ]] && our_daemon "$1" "${dir#/proc/}"; then echo "${dir#/proc/}"; fi
    done
}

wait_gone() { # wait_gone <seconds> <pid>...: until none of the pids runs; fails at the deadline
    local deadline=$((SECONDS + $1)) pid
    shift
    for pid in "$@"; do
        while running "$pid"; do
            ((SECONDS < deadline)) || return 1
            sleep 0.2
        done
    done
}

# remove_files <name>: the daemon's pid files (ours and its own) and sockets, once it is gone.
remove_files() {
    rm -f "$BASE/run/$1.pid" "$BASE/run/$1.daemon.pid"
    case $1 in
    munged) rm -f "$BASE/run/munge.socket" "$BASE/run/munge.socket.lock" ;;
    mariadbd) rm -f "$BASE/run/mysqld.sock" "$BASE/run/mysqld.sock.lock" ;;
    esac
}

# stop_daemon <name>: SIGTERM, a bounded wait for a clean shutdown (slurmctld saves its state, MariaDB
# flushes InnoDB), then SIGKILL. Fails only if the daemon cannot be got rid of.
stop_daemon() {
    local name=$1 pids
    mapfile -t pids < <(pids_of "$name")
    if ((${#pids[@]})); then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        if wait_gone "$TERM_WAIT" "${pids[@]}"; then
            say "stopped $name (pid ${pids[*]})"
        else
            kill -KILL "${pids[@]}" 2>/dev/null || true
            wait_gone "$KILL_WAIT" "${pids[@]}" || {
                warn "$name (pid ${pids[*]}) is still running after SIGKILL"
                return 1
            }
            say "killed $name (pid ${pids[*]}): it did not stop within $TERM_WAIT s of SIGTERM"
        fi
    fi
    remove_files "$name"
}

# Cancel the cluster's jobs first, so no job step outlives slurmd.
cancel_jobs() {
    local jobs i
    [[ -n $(pids_of slurmctld) ]] || return 0
    jobs=$(timeout 30 /usr/bin/squeue -h -o %i 2>/dev/null || true)
    [[ -n $jobs ]] || return 0
    say "cancelling jobs: $(echo $jobs)"
    timeout 30 /usr/bin/scancel $jobs || true
    for ((i = 0; i < 40; i++)); do
        [[ -z $(timeout 30 /usr/bin/squeue -h -o %i 2>/dev/null) ]] && break
        sleep 0.5
    done
}

# The /etc/slurm/slurm.conf symlink goes too once neither slurmctld nor slurmd runs (start-slurm.sh makes
# it again): with a config that names a controller that is not running, every SLURM client call, and so
# every `snakemake` start (the SLURM executor plugin runs `scontrol show config` when it is imported),
# waits 10 s for that controller.
remove_default_config() {
    [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]] || return 0
    [[ -z $(pids_of slurmctld) && -z $(pids_of slurmd) ]] || return 0
    rm -f /etc/slurm/slurm.conf
    say "removed the /etc/slurm/slurm.conf symlink"
}

main() {
    local purge=0 only=0 wanted=() name failed=0
    case ${1:-} in
    --purge) purge=1 ;;
    --only) only=1 wanted=("${@:2}") ;;
    "") ;;
    *)
        warn "usage: stop-slurm.sh [--purge | --only NAME...]"
        return 2
        ;;
    esac
    if [[ ! -d $BASE ]]; then
        say "nothing to stop ($BASE does not exist)"
        return 0
    fi
    for name in "${DAEMONS[@]}"; do
        if ((only)) && [[ " ${wanted[*]} " != *" $name "* ]]; then continue; fi
        [[ $name != slurmd ]] || cancel_jobs
        stop_daemon "$name" || failed=1
    done
    remove_default_config
    ((!failed)) || return 1
    if ((purge)); then
        rm -rf "$BASE"
        say "removed $BASE"
    fi
}

main "$@"
