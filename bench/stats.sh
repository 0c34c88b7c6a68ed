# bench/stats.sh — the statistics the benchmark scripts share (sourced): medians, a bootstrap
# interval for a median, ratios printed as percentages.

# Median of the numbers on stdin, one per line (nothing for no input).
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) exit; if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# 90 % percentile-bootstrap interval of the median of the numbers on stdin.
boot_ci() {
  awk 'BEGIN { srand(42) } { r[NR] = $1 }
       END { for (b = 1; b <= 2000; b++) {
               for (i = 1; i <= NR; i++) s[i] = r[int(rand() * NR) + 1]
               for (i = 2; i <= NR; i++) { x = s[i]; for (j = i - 1; j > 0 && s[j] > x; j--) s[j + 1] = s[j]; s[j + 1] = x }
               print (NR % 2) ? s[(NR + 1) / 2] : (s[NR / 2] + s[NR / 2 + 1]) / 2 } }' |
    sort -g | awk 'NR == 101 { lo = $1 } NR == 1900 { hi = $1 } END { print lo, hi }'
}

# A ratio as a signed percentage: 1.0123 -> +1.23%.
pct() { awk -v r="$1" 'BEGIN{printf "%+.2f%%", (r-1)*100}'; }
