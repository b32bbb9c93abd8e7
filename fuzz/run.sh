#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the libFuzzer targets of a fuzz build (docs/fuzzing.md). For each target:
#   1. replays every seed of fuzz/corpus/<target>/ and every regression input of fuzz/regressions/<target>/, one by
#      one (a failure names the file);
#   2. fuzzes for SECONDS, starting from both directories but writing new inputs only to a scratch corpus, so the
#      repository is never modified (unless --save-regressions).
# Fails (exit 1) on any crash, sanitizer report, timeout (-timeout), memory blow-up (-rss_limit_mb, also a single
# malloc above it) or leak (LeakSanitizer). Findings are kept under the scratch directory and listed at the end.
#
# usage: fuzz/run.sh [--build DIR] [--seconds S] [--replay-only] [--keep-going] [--save-regressions] [TARGET...]
#   --build DIR          a fuzz build; repeat it for several (default build-fuzz); a target is taken from the
#                        first that has it
#   --seconds S          fuzzing time per target (default 60)
#   --replay-only        step 1 only
#   --keep-going         keep fuzzing after a finding (libFuzzer -fork=1 with -ignore_crashes etc.), to collect
#                        several in one run
#   --save-regressions   copy each finding into fuzz/regressions/<target>/ (for local runs; CI does not)
#   TARGET...            default: every fuzz_* program the build has
# Environment: FUZZ_WORK (scratch directory; default a new one under $TMPDIR), FUZZ_FLAGS (extra libFuzzer flags).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
builds=()
seconds=60
replay_only=0
keep_going=0
save=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) builds+=("$2"); shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --replay-only) replay_only=1; shift ;;
    --keep-going) keep_going=1; shift ;;
    --save-regressions) save=1; shift ;;
    -h|--help) sed -n '3,22p' "$0"; exit 0 ;;
    -*) echo "fuzz/run.sh: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

[ ${#builds[@]} -eq 0 ] && builds=(build-fuzz)
exe_of() {  # the program of target $1 in the first build that has it
  local b
  for b in "${builds[@]}"; do
    [ -x "$b/fuzz/$1" ] && { echo "$b/fuzz/$1"; return; }
  done
}
if [ ${#targets[@]} -eq 0 ]; then
  for t in fuzz_jsonl fuzz_npz fuzz_model fuzz_checkpoint; do
    [ -n "$(exe_of "$t")" ] && targets+=("$t")
  done
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz/run.sh: no fuzz targets in ${builds[*]} (make fuzz-build)" >&2
  exit 2
fi

work="${FUZZ_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/attnmix-fuzz-run.XXXXXX")}"
mkdir -p "$work"
# Sanitizer settings: every report is fatal, leaks included; LSan suppressions for libraries we do not build.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:detect_stack_use_after_return=1:strict_string_checks=1:allocator_may_return_null=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$here/lsan.supp:print_suppressions=0}"
common=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
read -r -a extra <<< "${FUZZ_FLAGS:-}"

dict_of() {
  case "$1" in
    fuzz_jsonl|fuzz_model) echo "$here/dict/json.dict" ;;
    fuzz_npz) echo "$here/dict/npz.dict" ;;
    fuzz_checkpoint) echo "$here/dict/checkpoint.dict" ;;
  esac
}

failed=()
for t in "${targets[@]}"; do
  exe="$(exe_of "$t")"
  [ -n "$exe" ] || { echo "fuzz/run.sh: $t is in none of ${builds[*]}" >&2; failed+=("$t (missing)"); continue; }
  mkdir -p "$work/$t/corpus" "$work/$t/findings"
  seeds=()
  for d in "$here/corpus/$t" "$here/regressions/$t"; do
    [ -d "$d" ] && while IFS= read -r -d '' f; do seeds+=("$f"); done < <(find "$d" -type f -print0 | sort -z)
  done
  start=$(date +%s)
  if [ ${#seeds[@]} -gt 0 ]; then
    echo "== $t: replaying ${#seeds[@]} seed and regression inputs"
    if ! "$exe" "${common[@]}" "${extra[@]}" "${seeds[@]}" > "$work/$t/replay.log" 2>&1; then
      tail -n 60 "$work/$t/replay.log"
      echo "== $t: FAILED replaying $(grep -o 'Running: .*' "$work/$t/replay.log" | tail -n 1 | cut -c10-)"
      failed+=("$t (replay)")
      continue
    fi
  fi
  if [ "$replay_only" -eq 0 ]; then
    echo "== $t: fuzzing for ${seconds}s"
    flags=("${common[@]}" -max_total_time="$seconds" -artifact_prefix="$work/$t/findings/")
    dict="$(dict_of "$t")"
    [ -n "$dict" ] && [ -f "$dict" ] && flags+=(-dict="$dict")
    if [ "$keep_going" -eq 1 ]; then
      flags+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    fi
    dirs=("$work/$t/corpus")
    for d in "$here/corpus/$t" "$here/regressions/$t"; do [ -d "$d" ] && dirs+=("$d"); done
    status=0
    "$exe" "${flags[@]}" "${extra[@]}" "${dirs[@]}" > "$work/$t/fuzz.log" 2>&1 || status=$?
    grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' "$work/$t/fuzz.log" | tail -n 3 || true
    found=$(find "$work/$t/findings" -type f | wc -l)
    if [ "$status" -ne 0 ] || [ "$found" -gt 0 ]; then
      grep -E 'ERROR: |SUMMARY: |runtime error|terminate called|what\(\)' "$work/$t/fuzz.log" | head -n 20 || true
      echo "== $t: FAILED (exit $status, $found finding(s) in $work/$t/findings; log $work/$t/fuzz.log)"
      if [ "$save" -eq 1 ] && [ "$found" -gt 0 ]; then
        mkdir -p "$here/regressions/$t"
        cp "$work/$t/findings/"* "$here/regressions/$t/"
        echo "== $t: copied the findings into fuzz/regressions/$t/"
      fi
      failed+=("$t")
      continue
    fi
  fi
  echo "== $t: ok ($(( $(date +%s) - start ))s)"
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz/run.sh: FAILED: ${failed[*]}"
  echo "Reproduce one input with: <build>/fuzz/<target> <file>   (scratch directory: $work)"
  exit 1
fi
echo "fuzz/run.sh: every target passed (${targets[*]})"
[ -z "${FUZZ_WORK:-}" ] && rm -rf "$work"
exit 0
