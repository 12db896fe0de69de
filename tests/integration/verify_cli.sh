# attnscope verify: the report table, its CSV and JSON, the exit code, the cost rows, bad flags.
expect_ok "$ATTNSCOPE" verify --help
expect_grep '^usage: attnscope verify ' "$WORK/out.txt"
for flag in --trials --json --no-timing --timing-max-n --timing-repeats --seed --out; do
  expect_grep "$flag" "$WORK/out.txt"
done

# 20 fixed rows and the linear-form identity of every kernel family of the registry computed from
# q and k alone (no "layer data" line: verify draws q and k), paper and code.
expect_ok "$ATTNSCOPE" info --families
kernels=$(awk '/^[a-z]/ { if (k && !data) n++; k = 0; data = 0 } /^  form         kernel/ { k = 1 }
  /^  layer data/ { data = 1 } END { if (k && !data) n++; print n + 0 }' "$WORK/out.txt")
[ "$kernels" -ge 5 ] || { echo "FAIL: info --families lists $kernels kernel families"; exit 1; }
rows=$((20 + 2 * kernels))
expect_ok "$ATTNSCOPE" verify --trials 10 --no-timing --seed 3 --out "$WORK/a"
expect_empty "$WORK/err.txt"
expect_grep "^$rows of $rows checks passed\$" "$WORK/out.txt"
[ "$(grep -c '^linear_form\.' "$WORK/out.txt")" -eq $((2 * kernels)) ] || { echo "FAIL: linear_form rows"; exit 1; }
for check in prop1.random prop1.adversarial prop1.hyperplane prop2.relu_collinear \
    prop2.identity_negation prop2.relu_affine lemma1.leaky_relu lemma1.elu1 prop3.random \
    prop3.collinear prop3.hyperplane mala.rows_sum_to_one mala.eq11 mala.eq19 mala.eq22 \
    mala.eq22_needs_positivity linear_form.inline:identity@paper linear_form.mala:elu1@code \
    cost.inline:identity@code.linear_time cost.mala:elu1@code.explicit; do
  expect_grep "^$check +[0-9]+ .*PASS" "$WORK/out.txt"
done
expect_grep '^check,what,trials,margin,threshold,result$' "$WORK/a/verify.csv"
[ "$(grep -c ',PASS$' "$WORK/a/verify.csv")" -eq "$rows" ] || { echo "FAIL: verify.csv"; exit 1; }
expect_grep '"failed": 0' "$WORK/a/verify.json"

# Seeded: the same seed gives the same report.
expect_ok "$ATTNSCOPE" verify --trials 10 --no-timing --seed 3 --out "$WORK/b"
cmp "$WORK/a/verify.csv" "$WORK/b/verify.csv" || { echo "FAIL: not reproducible"; exit 1; }

# --json: machine-readable on stdout, same rows.
expect_ok "$ATTNSCOPE" verify --trials 5 --no-timing --json --out "$WORK/c"
"$PYTHON" -c "
import json, sys
j = json.load(open('$WORK/out.txt'))
assert j['failed'] == 0 and len(j['rows']) == $rows, j
assert all(r['result'] == 'PASS' and r['trials'] >= 1 for r in j['rows'])
" || { echo "FAIL: --json"; cat "$WORK/out.txt"; exit 1; }

# The cost rows count work: deterministic, so timing (information only) never changes a verdict
# and a fast, noisy timing run still exits 0.
expect_ok "$ATTNSCOPE" verify --trials 2 --timing-max-n 256 --timing-repeats 1 --out "$WORK/d"
for row in cost.inline:identity@code.linear_time cost.mala:elu1@code.linear_time; do
  expect_grep "^$row,.*,6,(1|0\.99999[0-9]*|1\.0000[0-9]*),<= 1\.01,PASS$" "$WORK/d/verify.csv"
done
for row in cost.inline:identity@code.explicit cost.mala:elu1@code.explicit; do
  expect_grep "^$row,.*,6,(2|1\.99999[0-9]*|2\.0000[0-9]*),> 1\.9,PASS$" "$WORK/d/verify.csv"
done
expect_grep '^info, not checked' "$WORK/out.txt"
if grep -q 'FAIL' "$WORK/out.txt"; then echo "FAIL: a FAIL row with timing on"; exit 1; fi
expect_grep '^variant,n,dim,linear_time_s,explicit_s$' "$WORK/d/verify_timing.csv"
[ "$(wc -l <"$WORK/d/verify_timing.csv")" -eq 7 ] || { echo "FAIL: verify_timing.csv"; exit 1; }

# Bad flags: exit 2, one line.
expect_exit 2 "--trials must be >= 1" "$ATTNSCOPE" verify --trials 0 --out "$WORK/e"
expect_exit 2 "--timing-max-n must be >= 128" "$ATTNSCOPE" verify --timing-max-n 64 --out "$WORK/e"
expect_exit 2 "--timing-repeats must be >= 1" "$ATTNSCOPE" verify --timing-repeats 0 --out "$WORK/e"
expect_exit 2 "unrecognised option '--nope'" "$ATTNSCOPE" verify --nope
expect_exit 2 "--trials" "$ATTNSCOPE" verify --trials many
expect_no_file "$WORK/e/verify.csv" "$WORK/e/verify.json"
