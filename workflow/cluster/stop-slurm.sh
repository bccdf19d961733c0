#!/usr/bin/env bash
# Stop the single-node cluster of workflow/cluster/start-slurm.sh: cancel its jobs, then stop the
# daemons it started (the pids it recorded under $LARGEPROMPT_SLURM_DIR/run), newest first. Any other
# slurmctld, slurmd, munged or MariaDB on the machine is left alone.
#
#   workflow/cluster/stop-slurm.sh           # stop and remove the /etc/slurm/slurm.conf symlink that
#                                            # start-slurm.sh made; keep configs, accounting and job history
#   workflow/cluster/stop-slurm.sh --purge   # the same, then delete $LARGEPROMPT_SLURM_DIR
set -euo pipefail

BASE=${LARGEPROMPT_SLURM_DIR:-/tmp/largeprompt-slurm}
export SLURM_CONF=$BASE/etc/slurm.conf

say() { echo "stop-slurm: $*"; }

# alive <name>: run/<name>.pid names a live <name> that start-slurm.sh started for $BASE (the pid's command
# name and its SLURM_CONF are checked, so a recycled pid is never taken for ours).
alive() {
    local pid
    pid=$(cat "$BASE/run/$1.pid" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] || return 1
    tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF"
}

stop() {
    local name=$1 pid i
    if ! alive "$name"; then
        rm -f "$BASE/run/$name.pid"
        return 0
    fi
    pid=$(cat "$BASE/run/$name.pid")
    kill -TERM "$pid"
    for ((i = 0; i < 60; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid"
        say "killed $name (pid $pid)"
    else say "stopped $name (pid $pid)"; fi
    rm -f "$BASE/run/$name.pid"
}

[[ -d $BASE ]] || {
    say "nothing to stop ($BASE does not exist)"
    exit 0
}
if alive slurmctld; then
    jobs=$(/usr/bin/squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        say "cancelling jobs: $(echo $jobs)"
        /usr/bin/scancel $jobs || true
        for ((i = 0; i < 20; i++)); do
            [[ -z $(/usr/bin/squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.5
        done
    fi
fi
for name in slurmd slurmctld slurmdbd mariadbd munged; do stop "$name"; done
# The /etc/slurm/slurm.conf symlink goes too (start-slurm.sh makes it again): with a config that names a
# controller that is not running, every SLURM client call, and so every `snakemake` start (the SLURM executor
# plugin runs `scontrol show config` when it is imported), waits 10 s for that controller.
if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]]; then
    rm -f /etc/slurm/slurm.conf
    say "removed the /etc/slurm/slurm.conf symlink"
fi
if [[ ${1:-} == --purge ]]; then
    rm -rf "$BASE"
    say "removed $BASE"
fi
