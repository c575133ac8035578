# swerl persistent shell session: the first input of `bash --noediting --noprofile --norc -i`.
# Interactive, so that SIGINT aborts the running command line like Ctrl-C in a terminal (and breaks
# builtin loops) instead of killing the shell; prompts and job messages go to /dev/null.
# Every later input line is one command wrapped by the host (swerl/sandbox/session.py):
#   __swerl_nonce=N; : > OUT; { eval $'CMD'
#   } </dev/null >>OUT 2>&1; __swerl_done $? N
# The command runs in this shell (so `cd` and `export` persist) with stdin from /dev/null (so it
# cannot eat the protocol), and its output goes to a size-capped tmpfs file opened O_APPEND (so a
# daemon it leaves behind can neither block us nor punch holes into the next command's output).
exec 9>&1 2>/dev/null
set +o history +H +m
PS1='' PS2='' PS4='' PROMPT_COMMAND=''
echo $$ >> "$SWERL_RUN/shells"
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
__swerl_begin() {  # $1 = nonce; what follows up to the end marker is the command's output
    printf '__SWERL_BEGIN_%s\n' "$1" >&9
}
__swerl_mark() {  # $1 = exit status, $2 = nonce, $3 = OOM kills, $4 = 1 when the shell is exiting
    printf '\n__SWERL_DONE_%s %d %d %d %s__SWERL_END_%s\n' "$2" "$1" "$3" "$4" "$PWD" "$2" >&9
}
__swerl_done() {  # $1 = exit status, $2 = nonce, $3 = 1 when the shell is exiting
    local before=$__swerl_oom
    __swerl_oom_count
    __swerl_begin "$2"
    [ -s "$SWERL_RUN/out" ] && head -c "$SWERL_CAP" "$SWERL_RUN/out" >&9
    __swerl_mark "$1" "$2" $((__swerl_oom - before)) "${3:-0}"
}
trap '__swerl_done $? "$__swerl_nonce" 1' EXIT
__swerl_oom_count
__swerl_nonce=init
