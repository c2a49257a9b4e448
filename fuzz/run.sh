#!/usr/bin/env bash
# Runs berth's cargo fuzz targets, one after another, for SECONDS each
# (default 60), and prints one line per target: executions per second, the
# corpus, and what it found.
#
#   fuzz/run.sh [SECONDS] [TARGET...]       (all targets when none is named)
#
# It installs cargo-fuzz if it is missing. With a nightly toolchain it builds
# with AddressSanitizer; without one it builds with no sanitizer on the
# stable toolchain (RUSTC_BOOTSTRAP lets cargo-fuzz pass its -Z flags).
# Debug assertions are on (overflow checks). New corpus inputs go to
# fuzz/corpus/TARGET (ignored by git), findings to fuzz/artifacts/TARGET,
# and each run's libFuzzer log to fuzz/target/run-logs/TARGET.log.
# A finding stops its target's run (libFuzzer's default); the line names it.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
secs="${1:-60}"
shift || true

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    echo "installing cargo-fuzz ..."
    cargo install cargo-fuzz --locked || exit 1
fi

if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    toolchain=(+nightly)
    sanitizer=address
else
    toolchain=()
    sanitizer=none
    export RUSTC_BOOTSTRAP=1
fi
fuzz=(cargo "${toolchain[@]}" fuzz)

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <("${fuzz[@]}" list)
fi

echo "building ${targets[*]} (sanitizer: $sanitizer) ..."
"${fuzz[@]}" build -a -s "$sanitizer" || exit 1

mkdir -p target/run-logs
status=0
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(ls "artifacts/$t" | sort)
    log="target/run-logs/$t.log"
    extra=()
    [ -f "dicts/$t.dict" ] && extra+=("-dict=dicts/$t.dict")
    # sled 0.34 leaks a little when a database closes (crossbeam-epoch
    # garbage of its page cache): leak checks (libFuzzer's after an input,
    # LeakSanitizer's at the exit) would report sled, not berth.
    asan="${ASAN_OPTIONS:-}"
    case "$t" in
        store_ops | control | batch)
            extra+=("-detect_leaks=0")
            asan="detect_leaks=0${asan:+:$asan}"
            ;;
    esac
    ASAN_OPTIONS="$asan" "${fuzz[@]}" run -a -s "$sanitizer" "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -timeout=30 -print_final_stats=1 "${extra[@]}" \
        >"$log" 2>&1
    rc=$?
    execs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
    units=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
    corp=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$log" | tail -n 1 | cut -d' ' -f2)
    files=$(ls "corpus/$t" | wc -l)
    found=$(comm -13 <(echo "$before") <(ls "artifacts/$t" | sort) | grep -v '^$' || true)
    if [ -n "$found" ]; then
        findings="$(echo "$found" | wc -l): $(echo "$found" | sed "s|^|fuzz/artifacts/$t/|" | tr '\n' ' ')"
        status=1
    elif [ "$rc" -ne 0 ]; then
        findings="libFuzzer exited with $rc (see $log)"
        status=1
    else
        findings=0
    fi
    printf '%-14s %6s exec/s  %9s runs  corpus %5s files (libFuzzer: %s)  findings %s\n' \
        "$t" "${execs:-?}" "${units:-?}" "$files" "${corp:-?}" "$findings"
done
exit "$status"
