#!/usr/bin/env bash
# stub_guard.sh STUB_PID TRITON_PID: a process of its own beside each Python stub (started by
# triton_io.guard_stub) that SIGKILLs the stub once its parent is no longer tritonserver: after
# tritonserver was killed, or exited at its exit timeout with this stub still loaded.
#
# Why a process and not a thread of the stub: a thread needs the stub's GIL, and an orphaned stub
# was seen with its GIL held forever by a thread blocked in IPC with the dead server (issue 20).
# Why not prctl(PR_SET_PDEATHSIG) on the stub: the kernel sends that signal when the *thread* of
# tritonserver that forked the stub exits, not the process, and the server keeps running after
# the thread that loaded a model is gone. Bash builtins only (a `read -t` on a pipe nobody writes
# is the sleep), so the guard forks nothing while it waits.
trap '' TERM INT HUP  # a signal to the server's process group must not end the guard first
stub=$1 parent=$2 self=$$
exec 9<> <(:)
ppid_of() {  # sets $ppid to the parent of PID $1 (field 4 of its stat, after "(comm)", which
  # may hold spaces); fails if PID is gone or a zombie
  local stat fields
  read -r stat < "/proc/$1/stat" || return 1
  fields=(${stat##*) })
  [ "${fields[0]}" != Z ] || return 1
  ppid=${fields[1]}
}
while :; do
  # Our own parent first: once the stub is gone we belong to init, and its pid may be reused.
  ppid_of "$self" && [ "$ppid" = "$stub" ] || exit 0
  ppid_of "$stub" 2>/dev/null || exit 0
  if [ "$ppid" != "$parent" ]; then
    echo "moss-tts stub guard: tritonserver (pid $parent) is gone; killing stub $stub" >&2
    kill -9 "$stub" 2>/dev/null
    exit 0
  fi
  read -rt 0.2 -u 9
done
