#!/usr/bin/env bash
# Packs every family fixture (tests/fixtures/families/*, HF directories) to every type
# `flowrt pack` writes and prints a Markdown table of the gate's figures (pack against its
# source, teacher-forced on the built-in prompts): positions, top-1 agreement, mean and max
# KL(source ‖ pack), the matrices that fell back to another type because their row length
# does not fit the type's block, and how many `llama.cpp:` caveats the report gave.
#
# Usage: scripts/pack_table.sh [CASE...]     (default: every fixture directory)
# Binary: $FLOWRT, else target/ci/flowrt (cargo build --profile ci -p flowrt-cli).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
flowrt=${FLOWRT:-$root/target/ci/flowrt}
if [[ ! -x $flowrt ]]; then
    echo "pack_table.sh: no flowrt binary at $flowrt (build it with" \
        "'cargo build --profile ci -p flowrt-cli', or set FLOWRT)" >&2
    exit 2
fi
types=(F32 F16 BF16 Q8_0 Q6_K Q5_K Q4_K Q4_1 Q4_0)
if [[ $# -gt 0 ]]; then
    cases=("$@")
else
    cases=()
    for d in "$root"/tests/fixtures/families/*/; do
        [[ -f $d/config.json ]] && cases+=("$(basename "$d")")
    done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "| fixture | type | positions | top-1 | mean KL | max KL | fallbacks | llama.cpp caveats |"
echo "|---|---|---|---|---|---|---|---|"
status=0
for c in "${cases[@]}"; do
    src=$root/tests/fixtures/families/$c
    for t in "${types[@]}"; do
        out=$work/$c-$t.gguf
        if report=$(FLOWRT_LOG=off "$flowrt" pack "$src" -o "$out" --quant "$t" 2>&1); then
            verdict=""
        else
            verdict=" (refused)"
            status=1
        fi
        gate=$(grep -m1 -E '^gate: +[0-9]+ positions' <<<"$report" || true)
        if [[ -z $gate ]]; then
            echo "| $c | $t | error: $(tail -n1 <<<"$report" | tr '|' '/') | | | | | |"
            status=1
            continue
        fi
        positions=$(sed -E 's/^gate: +([0-9]+) positions.*/\1/' <<<"$gate")
        top1=$(sed -E 's/.*top-1 ([0-9.]+%).*/\1/' <<<"$gate")
        mean=$(sed -E 's/^gate: .*%, mean KL ([^,]+), max KL.*/\1/' <<<"$gate")
        max=$(sed -E 's/^gate: .*, max KL ([^ ]+) \(bounds.*/\1/' <<<"$gate")
        # "fallback:  NAME: ... written as TYPE" -> "N to TYPE" per target type.
        fallbacks=$( (grep -E '^fallback:' <<<"$report" || true) | sed -E 's/.*written as //' |
            sort | uniq -c | awk '{printf "%s%s to %s", (NR>1 ? ", " : ""), $1, $2}')
        caveats=$(grep -c '^llama.cpp:' <<<"$report" || true)
        echo "| $c | $t | $positions | $top1$verdict | $mean | $max | ${fallbacks:-none} | $caveats |"
        rm -f "$out"
    done
done
exit $status
