# Process checks shared by start-slurm.sh and stop-slurm.sh (sourced, never run): is a pid alive, and is it one of
# this cluster's daemons. Needs SLURM_CONF exported (the cluster's slurm.conf: every daemon it starts inherits it).

comm_of() { # comm_of <pid>: the process's command name ("" when there is no such process)
    local comm=""
    { read -r comm <"/proc/$1/comm"; } 2>/dev/null || true
    echo "$comm"
}

# running <pid>: the process exists and has not exited. kill -0 also succeeds for a zombie (exited, only waiting
# to be reaped: by the start script while it runs, by init afterwards), so its state is checked too.
running() {
    local stat
    kill -0 "$1" 2>/dev/null || return 1
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    stat=${stat##*") "} # the fields after "(comm)"; the first is the state
    [[ ${stat:0:1} != [ZX] ]]
}

# our_daemon <name> <pid>: <pid> runs <name> and was started for this cluster: its SLURM_CONF is ours, so a
# recycled pid, or another cluster's daemon, is never taken for ours.
our_daemon() {
    running "$2" && [[ $(comm_of "$2") == "$1" ]] || return 1
    grep -qzxF "SLURM_CONF=$SLURM_CONF" "/proc/$2/environ" 2>/dev/null
}
