# swerl sandbox supervisor: the main process of every sandbox container (under docker-init).
# Passed inline as `bash -c` so it works in any image that has bash (swerl's own or SWE-bench's).
#
# It exists so the host can stop runaway commands *without starting a process in the container*:
# under a fork bomb the PIDs limit makes every `docker exec` fail, but a signal to PID 1 still
# arrives, and everything below uses bash builtins only (no fork). Escalation for a timed-out command:
#   SIGUSR1: SIGINT to every process except the registered session shells (like Ctrl-C: the
#            command's process dies or handles it; the session shell, which only waits, reports it)
#   SIGUSR2: SIGKILL to every process except the registered session shells (commands ignoring SIGINT)
#   SIGHUP:  SIGKILL to every process, shells included (a hard reset; the host starts a new shell)
# Session shells register their PID in $SWERL_RUN/shells.
# The traps run asynchronously: a sweep may still be walking /proc after the command it was sent for
# has died and the host has sent the next one, which it would then kill. So each finished trap counts
# itself in $SWERL_RUN/handled (root's, created before any command runs), and the harness starts a
# command only once every signal the host sent before it has been handled (see __swerl_settle).

SWERL_RUN=${SWERL_RUN:-/run/swerl}

__keep() {  # is $1 a registered shell?
    local s
    [ -r "$SWERL_RUN/shells" ] || return 1
    while read -r s; do [ "$s" = "$1" ] && return 0; done < "$SWERL_RUN/shells"
    return 1
}

__interrupt() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = 1 ] || [ "$p" = "$$" ] || __keep "$p" || kill -INT "$p" 2>/dev/null
    done
}

__sweep() {  # $1 = 1 to spare the registered shells
    local pass p found
    # Stop first, then kill: a stopped process cannot fork, so the sweep converges on a fork bomb.
    for pass in 1 2 3 4 5 6 7 8 9 10 11 12; do
        found=0
        for p in /proc/[0-9]*; do
            p=${p#/proc/}
            [ "$p" = 1 ] && continue
            [ "$p" = "$$" ] && continue
            [ "$1" = 1 ] && __keep "$p" && continue
            kill -STOP "$p" 2>/dev/null && found=1
        done
        [ "$found" = 0 ] && break
        for p in /proc/[0-9]*; do
            p=${p#/proc/}
            [ "$p" = 1 ] && continue
            [ "$p" = "$$" ] && continue
            [ "$1" = 1 ] && __keep "$p" && continue
            kill -KILL "$p" 2>/dev/null
        done
    done
}

__handled=0
__done() {  # one more signal handled; a builtin redirect, so it works under a fork bomb too
    __handled=$((__handled + 1))
    printf '%s\n' "$__handled" > "$SWERL_RUN/handled"
}
printf '0\n' > "$SWERL_RUN/handled"
trap '__interrupt; __done' USR1
trap '__sweep 1; __done' USR2
trap '__sweep 0; __done' HUP
trap 'exit 0' TERM INT
# Idle without ever forking again: under a fork bomb a fork would block in bash's retry loop, and
# pending traps only run once it succeeds. `read` on a FIFO nobody writes is a builtin that signals
# interrupt. (Orphans are reaped by the container's init, docker-init.)
mkfifo "$SWERL_RUN/idle" 2>/dev/null
exec 3<>"$SWERL_RUN/idle"
while :; do
    read -r -t 86400 -u 3
done
