# swerl persistent shell session: the first input of `bash --noprofile --norc`, started as root by
# `docker exec` (the harness shell). $SWERL_USER is the user the commands run as.
#
# The harness never runs model code. Each command runs in a child process that the harness forks
# and that drops to $SWERL_USER; everything the protocol trusts stays in the harness:
#   host → shell:  __swerl_run $'. H/child.sh; eval $\'CMD\'' S
#                  #N
#   shell → host:  __SWERL_BEGIN_N\n<first SWERL_CAP bytes of OUT>\n__SWERL_DONE_N rc ooms cwd__SWERL_END_N\n
# - S is how many signals the host has sent the supervisor: the harness forks the child only once
#   they have all been handled (__swerl_settle).
# - The exit status is what the harness's `wait` got from the child: `$?` after the subshell.
# - The nonce N is a line the host sends after the command line. The harness reads its input one
#   byte at a time (bash does so on a pipe), so N waits in the kernel's pipe buffer until
#   `__swerl_finish` reads it, after the child has exited: N is never in a variable, an argument or
#   the environment of anything the command runs, nor in any process it could read.
# - The child has no descriptor to the host: stdin is /dev/null, stdout and stderr go to OUT (a file
#   on a size-capped tmpfs opened O_APPEND, so a daemon left behind can neither block us nor punch
#   holes into the next command's output), and fd 9, the harness's channel, is closed.
# - The command's user cannot reach the harness either: it is another user (root), which a process
#   without CAP_SYS_PTRACE (Docker drops it) can neither trace nor open the descriptors of in /proc;
#   H is a root-owned directory, so the files the harness reads there cannot be swapped for links.
#   (A sandbox whose user is root has no such boundary: that is the image's choice.)
# - The harness uses builtins only from the first command on, so no program the command could
#   replace ever runs in it.
# State persists the way a terminal's does: when the child exits it writes its variables, functions,
# aliases, options, umask and directory to H/state, and the next child loads them. The file is the
# command's own (it may write anything there) and is only ever read by a child.
exec 9>&1 2>/dev/null
__swerl_h=$SWERL_RUN/h
__swerl_settled=0
__swerl_settle() {  # $1 = how many signals the host has sent the supervisor (see supervisor.sh)
    # Start nothing until the supervisor has handled them all, or a sweep still running could kill
    # it. Bash runs one trap for signals of a kind that arrive together, so a count may never come:
    # after 5 s the shortfall is kept in h/lag (it shrinks again if the signal was only late).
    [ "${1:-0}" -le "$__swerl_settled" ] && return
    local handled=0 lag=0 i
    [ -r "$__swerl_h/lag" ] && IFS= read -r lag < "$__swerl_h/lag"
    for ((i = 0; i < 100; i++)); do
        IFS= read -r handled < "$SWERL_RUN/handled"
        [ "${handled:-0}" -ge $(($1 - lag)) ] && break
        # a 50 ms sleep without forking: the supervisor's FIFO, which nobody writes
        [ -p "$SWERL_RUN/idle" ] && read -r -t 0.05 <> "$SWERL_RUN/idle"
    done
    [ "${handled:-0}" -ge "$1" ] && lag=0 || lag=$(($1 - ${handled:-0}))
    printf '%s\n' "$lag" > "$__swerl_h/lag"
    __swerl_settled=$1
}
__swerl_settle "${SWERL_SIGNALS:-0}"
echo $$ >> "$SWERL_RUN/shells"
__swerl_as=
if [ "$SWERL_USER" != root ] && [ "$SWERL_USER" != 0 ]; then
    if ! command -v setpriv > /dev/null; then
        echo "__SWERL_FAIL_$$ the image has no setpriv (util-linux), needed to run commands as $SWERL_USER"
    elif ! __swerl_uid=$(id -u -- "$SWERL_USER") || ! __swerl_gid=$(id -g -- "$SWERL_USER") ||
            ! __swerl_groups=$(id -G -- "$SWERL_USER"); then
        echo "__SWERL_FAIL_$$ the image has no user $SWERL_USER"
    fi
    # the user's groups looked up once here, not by every command (as `docker exec --user` would)
    __swerl_as="setpriv --reuid=$__swerl_uid --regid=$__swerl_gid --groups=${__swerl_groups// /,} --"
else
    __swerl_uid=0 __swerl_gid=0
fi
if [ ! -d "$__swerl_h" ]; then  # the first shell of this sandbox (later ones find the state)
    mkdir -m 0755 "$__swerl_h"
    # where write_file stages a file before the user moves it into place: the user's own directory,
    # in root's / so it cannot be renamed or swapped for a link (the archive API writes as root)
    rm -rf "$SWERL_STAGE"; mkdir -m 0700 "$SWERL_STAGE"; chown "$__swerl_uid:$__swerl_gid" "$SWERL_STAGE"
    : > "$__swerl_h/out"; : > "$__swerl_h/cwd"; : > "$__swerl_h/state"
    chown "$__swerl_uid:$__swerl_gid" "$__swerl_h/out" "$__swerl_h/cwd" "$__swerl_h/state"
    cat > "$__swerl_h/child.sh" <<'__SWERL_CHILD__'
# swerl: sourced first by the shell that runs each command (see session_init.sh)
__swerl_boot=(${!a@} ${!b@} ${!c@} ${!d@} ${!e@} ${!f@} ${!g@} ${!h@} ${!i@} ${!j@} ${!k@} ${!l@} ${!m@}
    ${!n@} ${!o@} ${!p@} ${!q@} ${!r@} ${!s@} ${!t@} ${!u@} ${!v@} ${!w@} ${!x@} ${!y@} ${!z@} ${!A@}
    ${!B@} ${!C@} ${!D@} ${!E@} ${!F@} ${!G@} ${!H@} ${!I@} ${!J@} ${!K@} ${!L@} ${!M@} ${!N@} ${!O@}
    ${!P@} ${!Q@} ${!R@} ${!S@} ${!T@} ${!U@} ${!V@} ${!W@} ${!X@} ${!Y@} ${!Z@} ${!_@})
__swerl_save() {  # the EXIT trap: this command's state, for the next one
    local __swerl_rc=$? __swerl_n __swerl_keep=()
    # stopped by a signal (a timeout's interrupt): keep the last finished command's state rather than
    # write one the sweep that may follow could cut in half
    [ -n "${__swerl_sig:-}" ] && return "$__swerl_rc"
    exec 2>&-  # the shell is exiting: nothing here is the command's output (e.g. after `ulimit -n 3`)
    {
        for __swerl_n in "${__swerl_boot[@]}"; do  # what the shell was born with but the command unset
            [ -v "$__swerl_n" ] || printf 'unset -v %s\n' "$__swerl_n"
        done
        for __swerl_n in ${!a@} ${!b@} ${!c@} ${!d@} ${!e@} ${!f@} ${!g@} ${!h@} ${!i@} ${!j@} ${!k@} \
                ${!l@} ${!m@} ${!n@} ${!o@} ${!p@} ${!q@} ${!r@} ${!s@} ${!t@} ${!u@} ${!v@} ${!w@} \
                ${!x@} ${!y@} ${!z@} ${!A@} ${!B@} ${!C@} ${!D@} ${!E@} ${!F@} ${!G@} ${!H@} ${!I@} \
                ${!J@} ${!K@} ${!L@} ${!M@} ${!N@} ${!O@} ${!P@} ${!Q@} ${!R@} ${!S@} ${!T@} ${!U@} \
                ${!V@} ${!W@} ${!X@} ${!Y@} ${!Z@} ${!_@}; do
            case $__swerl_n in  # bash's own variables (restoring the read-only ones would end the shell)
                BASH*|EUID|PPID|UID|SHELLOPTS|GROUPS|FUNCNAME|DIRSTACK|PIPESTATUS|RANDOM|SRANDOM) ;;
                SECONDS|LINENO|HISTCMD|EPOCHREALTIME|EPOCHSECONDS|COMP_*|_|PWD|SHLVL|__swerl*) ;;
                *) __swerl_keep+=("$__swerl_n") ;;
            esac
        done
        declare -p "${__swerl_keep[@]}"
        declare -f
        alias -p
        set +o
        shopt -p
        umask -p
        printf 'cd -- %q\n' "$PWD"
    } > "$SWERL_RUN/h/state"
    printf '%s\n' "$PWD" > "$SWERL_RUN/h/cwd"
    return "$__swerl_rc"
}
trap __swerl_save EXIT
trap '__swerl_sig=1; exit 130' INT
trap '__swerl_sig=1; exit 143' TERM
trap '__swerl_sig=1; exit 129' HUP
shopt -s expand_aliases  # as in a terminal
. "$SWERL_RUN/h/state" 2>/dev/null
__SWERL_CHILD__
fi
__swerl_oom_count() {
    local k v f
    __swerl_oom=0
    for f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do
        [ -r "$f" ] || continue
        while read -r k v; do
            [ "$k" = oom_kill ] && __swerl_oom=$v && return
        done < "$f"
    done
}
__swerl_begin() {  # $1 = nonce; what follows up to the end marker is the output
    printf '__SWERL_BEGIN_%s\n' "$1" >&9
}
__swerl_mark() {  # $1 = exit status, $2 = nonce, $3 = OOM kills, $4 = the command's directory
    printf '\n__SWERL_DONE_%s %d %d %s__SWERL_END_%s\n' "$2" "$1" "$3" "$4" "$2" >&9
}
__swerl_run() {  # $1 = the child's script, $2 = signals sent to the supervisor so far
    __swerl_settle "$2"
    : > "$__swerl_h/out"
    ( exec $__swerl_as bash --noprofile --norc -c "$1" ) </dev/null >>"$__swerl_h/out" 2>&1 9>&-
    __swerl_finish $?
}
__swerl_internal() {  # $1 = nonce, $2 = a harness command run as the command's user (output to the host),
                      # $3 = signals sent to the supervisor so far
    __swerl_settle "$3"
    __swerl_begin "$1"
    ( exec $__swerl_as bash --noprofile --norc -c "$2" ) </dev/null >&9 2>&1 9>&-
    __swerl_mark $? "$1" 0 ""
}
__swerl_finish() {  # $1 = the child's exit status, as `wait` reported it
    local rc=$1 n before=$__swerl_oom cwd= out=
    IFS= read -r n
    n=${n#\#}
    __swerl_oom_count
    IFS= read -r cwd < "$__swerl_h/cwd"
    __swerl_begin "$n"
    # builtins only: NUL bytes are dropped (a shell string cannot hold them)
    [ -s "$__swerl_h/out" ] && IFS= read -r -d '' -N "$SWERL_CAP" out < "$__swerl_h/out"
    printf '%s' "$out" >&9
    __swerl_mark "$rc" "$n" $((__swerl_oom - before)) "$cwd"
}
__swerl_oom_count
