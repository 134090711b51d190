#!/usr/bin/env bash
# Failures of a parallel run end every rank with a non-zero status and one clear line, never a
# hang (docs/parallel.md "Failures"). usage: failures.sh MPIEXEC DSV4 MODEL_DIR WORKDIR WHAT
#   kill0 / kill1  a rank (0 = the leader, 1 = a follower) is killed (SIGKILL) mid-run
#   stop1          a follower hangs (SIGSTOP) mid-run: the others' bounded wait (DSV4_MPI_TIMEOUT)
#   missing        the checkpoint is missing on one rank (a relative --model, another --wdir)
#   args           one rank was started with other arguments
#   noparallel     mpirun -np 2 without --parallel
#   isa            the ranks compute with different instruction sets (DSV4_ISA per rank)
set -uo pipefail
mpiexec=$1 bin=$2 model=$3 work=$4 what=$5
mpi=("$mpiexec" --oversubscribe --allow-run-as-root)
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; cat "$work/err" 2>/dev/null; exit 1; }

# The lines dsv4 itself printed (mpirun adds its own report of the failed rank).
check_one_line() {  # expected status class, words the line must hold...
  local n
  n=$(grep -c '^dsv4' "$work/err")
  [ "$n" = 1 ] || fail "expected one dsv4 line on stderr, got $n"
  for w in "$@"; do grep '^dsv4' "$work/err" | grep -q -- "$w" || fail "the error line lacks '$w'"; done
}

case $what in
kill0|kill1|stop1)
  victim=${what: -1}
  signal=KILL limit=30
  [ "$what" = stop1 ] && signal=STOP limit=15
  # A run long enough to be killed in: 3000 one-token decode steps (ids inside the tiny
  # vocabulary).
  toks=$(seq 0 2999 | awk '{print $1 % 1000 + 2}' | paste -sd,)
  start=$(date +%s.%N)
  "${mpi[@]}" -np 2 -x DSV4_MPI_TIMEOUT=2 "$bin" score --model "$model" --tokens "$toks" --prefill 0 --threads 1 --parallel ep \
    --out "$work/x.npy" >"$work/out" 2>"$work/err" &
  launcher=$!
  # Wait for the victim to be in its decode loop: both ranks started and loaded.
  pid=""
  for _ in $(seq 100); do
    for p in $(pgrep -P "$launcher" 2>/dev/null); do
      r=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
      [ "$r" = "$victim" ] && pid=$p
    done
    [ -n "$pid" ] && break
    sleep 0.05
  done
  [ -n "$pid" ] || { kill "$launcher"; fail "no rank $victim process under mpirun"; }
  sleep 1
  kill -0 "$launcher" 2>/dev/null || fail "the run ended before the kill (make it longer)"
  kill -0 "$pid" 2>/dev/null || fail "rank $victim ended before the kill"
  ! grep -q '^dsv4' "$work/err" || fail "the run failed before the kill"
  others=$(pgrep -P "$launcher" | grep -v "^$pid\$")
  t0=$(date +%s.%N)
  kill -s "$signal" "$pid"
  # Every rank must be gone within seconds (a stopped rank: the 2 s limit, then mpirun's
  # clean-up): bounded here, not by ctest's timeout.
  for _ in $(seq $((limit * 20))); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$launcher" 2>/dev/null; then
    kill -9 "$launcher" "$pid"
    fail "mpirun still running $limit s after rank $victim got SIG$signal"
  fi
  wait "$launcher"; status=$?
  t1=$(date +%s.%N)
  # mpirun may return while the others are still being reaped: give them a moment (a zombie
  # waiting for its parent counts as gone).
  alive() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
  for p in $others; do
    for _ in $(seq 60); do alive "$p" || break; sleep 0.05; done
    alive "$p" && { kill -9 "$p"; fail "rank process $p outlived the run by 3 s"; }
  done
  [ "$status" != 0 ] || fail "exit status 0 after rank $victim got SIG$signal"
  if [ "$what" = stop1 ]; then
    # Rank 0 reports the timeout. mpirun ends the job with SIGCONT before SIGTERM, so the stopped
    # rank may wake, find its own wait expired and say so too: one line per rank at most.
    [ "$(grep -c '^dsv4.*rank 0: waited' "$work/err")" = 1 ] || fail "expected rank 0's timeout line"
    n=$(grep -c '^dsv4' "$work/err")
    [ "$n" -le 2 ] || fail "expected at most one dsv4 line per rank, got $n"
    [ "$(grep '^dsv4' "$work/err" | grep -vc 'DSV4_MPI_TIMEOUT')" = 0 ] || fail "a line that is not the timeout"
  fi
  echo "rank $victim got SIG$signal: every rank gone, status $status, $(awk "BEGIN{printf \"%.2f\", $t1 - $t0}") s after it"
  ;;
missing)
  # Two working directories: the model (as a relative path) exists only in the first.
  mkdir -p "$work/has" "$work/lacks"
  ln -s "$(cd "$model" && pwd)" "$work/has/m"
  args=(score --model m --tokens 1,2,3 --threads 1 --parallel ep --out "$work/x.npy")
  timeout 60 "${mpi[@]}" -np 1 --wdir "$work/has" "$bin" "${args[@]}" : -np 1 --wdir "$work/lacks" "$bin" "${args[@]}" \
    >"$work/out" 2>"$work/err"
  status=$?
  [ "$status" != 124 ] || fail "hang"
  [ "$status" != 0 ] || fail "exit status 0"
  check_one_line "rank 1" "m"
  [ ! -e "$work/x.npy" ] || fail "an output was written"
  echo "missing checkpoint on rank 1: status $status, $(grep '^dsv4' "$work/err")"
  ;;
args)
  timeout 60 "${mpi[@]}" -np 1 "$bin" score --model "$model" --tokens 1,2,3 --threads 1 --parallel ep --out "$work/x.npy" : \
    -np 1 "$bin" score --model "$model" --tokens 1,2,4 --threads 1 --parallel ep --out "$work/x.npy" >"$work/out" 2>"$work/err"
  status=$?
  [ "$status" != 124 ] || fail "hang"
  [ "$status" != 0 ] || fail "exit status 0"
  check_one_line "rank 1" "1,2,4" "same command line"
  echo "mismatched arguments: status $status, $(grep '^dsv4' "$work/err")"
  ;;
noparallel)
  timeout 60 "${mpi[@]}" -np 2 "$bin" score --model "$model" --tokens 1,2,3 --threads 1 --out "$work/x.npy" >"$work/out" 2>"$work/err"
  status=$?
  [ "$status" != 124 ] || fail "hang"
  [ "$status" != 0 ] || fail "exit status 0"
  check_one_line "--parallel"
  echo "no --parallel under mpirun: status $status, $(grep '^dsv4' "$work/err")"
  ;;
isa)
  # Different kernels' summation orders would make the replicated state diverge: refused.
  args=(score --model "$model" --tokens 1,2,3 --threads 1 --parallel ep --out "$work/x.npy")
  timeout 60 "${mpi[@]}" -np 1 -x DSV4_ISA=scalar "$bin" "${args[@]}" : -np 1 -x DSV4_ISA=avx2 "$bin" "${args[@]}" \
    >"$work/out" 2>"$work/err"
  status=$?
  [ "$status" != 124 ] || fail "hang"
  [ "$status" != 0 ] || fail "exit status 0"
  check_one_line "rank 1" "isa avx2" "isa scalar"
  echo "different instruction sets: status $status, $(grep '^dsv4' "$work/err")"
  ;;
*) fail "unknown case $what" ;;
esac
