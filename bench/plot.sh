#!/usr/bin/env bash
# Draws one PNG from an outbox-bench results directory (outbox-bench --out DIR):
#   top left:     events/s per scenario (log scale), labelled with the ratio to the SQL ceiling;
#                 ceilings in grey
#   top right:    enqueue-to-delivery latency p50/p95/p99/max of the live-traffic scenarios
#                 (log scale; a drain's latency is only its wait in the backlog, so drains are
#                 left out), with the 20 ms p99 target
#   bottom left:  sustained load: backlog, produced/s and delivered/s over time
#   bottom right: sustained load: relay RSS and claim poll-cycle p99 over time
# Usage: bench/plot.sh RESULTS_DIR [OUTPUT.png [TITLE]]   (needs gnuplot: apt-get install gnuplot-nox)
set -euo pipefail
dir="${1:?usage: bench/plot.sh RESULTS_DIR [OUTPUT.png]}"
out="${2:-$dir/benchmarks.png}"
title="${3:-outbox-bench: $(basename "$dir")}"
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
[ -f "$dir/throughput.tsv" ] || { echo "plot.sh: $dir/throughput.tsv missing" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Throughput of the scenarios where it means something (open-loop runs just follow their
# fixed rate); ratio label only for relay scenarios.
awk -F'\t' '!/^#/ && $1 !~ /^open_loop|path_latency/ {
  ceiling = ($1 ~ /ceiling/);
  label = (ceiling || $3 == 0) ? "" : sprintf("%.2fx", $3);
  printf "%s\t%s\t%s\t%d\n", $1, $2, label, ceiling ? 10066329 : 4487082 }' "$dir/throughput.tsv" >"$tmp/throughput"
awk -F'\t' '!/^#/ && $1 !~ /drain/' "$dir/latency.tsv" >"$tmp/latency"

# Sustained timeline: per-second rates from the cumulative counters.
timeline="$dir/timeline_sustained_kafka.tsv"
if [ -f "$timeline" ]; then
  awk -F'\t' '!/^#/ { if (n++) printf "%s\t%s\t%s\t%s\t%s\t%s\n", $1, $4, ($2-p)/($1-t), ($3-d)/($1-t), $5, $7;
                      t=$1; p=$2; d=$3 }' "$timeline" >"$tmp/sustained"
else
  : >"$tmp/sustained"
fi

gnuplot <<EOF
set terminal pngcairo size 1500,1050 font "sans,10"
set output "$out"
set datafile separator "\t"
set multiplot layout 2,2 title "$title"

set title "Throughput (events/s; label: x SQL ceiling of this run)"
set style fill solid 0.7 border -1
set boxwidth 0.6
set logscale y
set yrange [100:*]
set xtics rotate by -30 left noenhanced
set grid ytics
unset key
plot "$tmp/throughput" using 0:2:4:xtic(1) with boxes lc rgb variable, \
     "" using 0:(\$2*1.25):3 with labels font ",9" notitle

set title "Enqueue-to-delivery latency (ms), live traffic; dashed: p99 target 20 ms"
set style data histograms
set style histogram clustered gap 1
set yrange [0.5:*]
set key outside right top vertical
if (system("test -s $tmp/latency && echo 1") eq "1") {
  plot "$tmp/latency" using 2:xtic(1) title "p50" lc rgb "#66ccee", \
       "" using 3 title "p95" lc rgb "#4477aa", \
       "" using 4 title "p99" lc rgb "#ee6677", \
       "" using 5 title "max" lc rgb "#aa3377", \
       20 with lines dt 2 lc rgb "black" notitle
} else {
  set multiplot next
}
set key inside

set style data lines
unset logscale y
set yrange [0:*]
set xtics norotate
set xlabel "seconds"
set title "Sustained load: backlog and rates"
set ylabel "messages"
set y2label "messages/s"
set y2tics
set ytics nomirror
set key top left
if (system("test -s $tmp/sustained && echo 1") eq "1") {
  plot "$tmp/sustained" using 1:2 title "backlog" axes x1y1 lw 2 lc rgb "#ee6677", \
       "" using 1:3 title "produced/s" axes x1y2 lc rgb "#999933", \
       "" using 1:4 title "delivered/s" axes x1y2 lc rgb "#4477aa"
  set title "Sustained load: relay RSS and claim poll-cycle p99"
  set ylabel "RSS (MiB)"
  set y2label "claim p99 (ms)"
  set yrange [0:*]
  plot "$tmp/sustained" using 1:5 title "relay RSS" axes x1y1 lw 2 lc rgb "#228833", \
       "" using 1:6 title "claim p99" axes x1y2 lc rgb "#aa3377"
}
unset multiplot
EOF
echo "plot.sh: wrote $out"
