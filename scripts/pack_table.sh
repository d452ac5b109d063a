#!/usr/bin/env bash
# Packs every family fixture (tests/fixtures/families/*, HF directories) to every type
# `flowrt pack` writes and prints a Markdown table of the gate's figures (pack against its
# source, teacher-forced on the built-in prompts): positions, top-1 agreement, mean and max
# KL(source ‖ pack), the matrices that fell back to another type because their row length
# does not fit the type's block, how many `llama.cpp:` caveats the report gave, and the
# pack's wall time and peak RSS (from /usr/bin/time when it is there).
#
# Usage: scripts/pack_table.sh [CASE...]     (default: every fixture directory)
# A CASE is a fixture's name, or a path to any HF checkpoint directory (e.g. the MiniCPM5-2B
# geometry of scripts/make_minicpm5_geometry.py). PACK_TYPES="Q8_0 Q4_K" packs only those.
# Binary: $FLOWRT, else target/ci/flowrt (cargo build --profile ci -p flowrt-cli).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
flowrt=${FLOWRT:-$root/target/ci/flowrt}
if [[ ! -x $flowrt ]]; then
    echo "pack_table.sh: no flowrt binary at $flowrt (build it with" \
        "'cargo build --profile ci -p flowrt-cli', or set FLOWRT)" >&2
    exit 2
fi
read -r -a types <<<"${PACK_TYPES:-F32 F16 BF16 Q8_0 Q6_K Q5_K Q4_K Q4_1 Q4_0}"
timer=()
[[ -x /usr/bin/time ]] && timer=(/usr/bin/time -f 'pack_table: %e s, %M KiB')
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

echo "| fixture | type | positions | top-1 | mean KL | max KL | fallbacks | llama.cpp caveats | time | peak RSS |"
echo "|---|---|---|---|---|---|---|---|---|---|"
status=0
for c in "${cases[@]}"; do
    if [[ $c == */* ]]; then src=$c; c=$(basename "$c"); else src=$root/tests/fixtures/families/$c; fi
    for t in "${types[@]}"; do
        out=$work/$c-$t.gguf
        if report=$(FLOWRT_LOG=off "${timer[@]}" "$flowrt" pack "$src" -o "$out" --quant "$t" 2>&1); then
            verdict=""
        else
            verdict=" (refused)"
            status=1
        fi
        gate=$(grep -m1 -E '^gate: +[0-9]+ positions' <<<"$report" || true)
        if [[ -z $gate ]]; then
            echo "| $c | $t | error: $(grep -v '^pack_table:' <<<"$report" | tail -n1 | tr '|' '/') | | | | | | | |"
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
        usage=$(grep -m1 '^pack_table:' <<<"$report" || true)
        secs=$(sed -E 's/^pack_table: ([0-9.]+) s.*/\1 s/' <<<"$usage")
        rss=$(sed -E 's/.*, ([0-9]+) KiB/\1/' <<<"$usage")
        [[ -n $rss ]] && rss="$(awk -v k="$rss" 'BEGIN { printf "%.2f GiB", k / 1048576 }')"
        echo "| $c | $t | $positions | $top1$verdict | $mean | $max | ${fallbacks:-none} | $caveats | ${secs:--} | ${rss:--} |"
        rm -f "$out"
    done
done
exit $status
