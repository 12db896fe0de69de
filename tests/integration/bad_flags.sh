# Flags that used to be accepted when they should not: thread counts the OpenMP runtime cannot
# take (also from OMP_NUM_THREADS), stray positional arguments, empty values and repeated list
# items. Each is exit 2 with one line naming the flag, and nothing is written.
expect_ok "$ATTNSCOPE" synth --out d.h5 --images 2 --layers 2 --heads 2

# The analyses, without --dump and --out; every command below gets its own --out.
analyses=(
  "confusion"
  "locality"
  "census"
  "maps --tokens 5"
  "spikiness --samples 4 --scales 0.5:2:3"
  "recompute"
  "distance"
  "entropy"
  "sinks"
  "rank"
  "rollout"
)
others=("verify --trials 1 --no-timing" "synth")
out_of() { if [ "$1" = synth ]; then echo t.h5; else echo r; fi; }
dump_of() { case "$1" in verify|synth) ;; *) echo --dump d.h5 ;; esac; }

# Thread counts: --threads above the limit, and OMP_NUM_THREADS huge, garbage or empty.
for a in "${analyses[@]}" "${others[@]}"; do
  read -r -a cmd <<<"$a"
  read -r -a dump <<<"$(dump_of "${cmd[0]}")"
  cmd+=("${dump[@]}" --out "$(out_of "${cmd[0]}")")
  expect_exit 2 "--threads must be at most 1024, got 100000" "$ATTNSCOPE" "${cmd[@]}" --threads 100000
  expect_no_file r t.h5
  for env in 100000 4,100000 abc 0 -2 "" 4x; do
    expect_fail "OMP_NUM_THREADS='$env': expected a thread count from 1 to 1024" \
      env OMP_NUM_THREADS="$env" "$ATTNSCOPE" "${cmd[@]}"
    rc=0; OMP_NUM_THREADS="$env" "$ATTNSCOPE" "${cmd[@]}" >/dev/null 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || { echo "FAIL: OMP_NUM_THREADS='$env' $a: exit $rc, expected 2"; exit 1; }
    expect_no_file r t.h5
  done
done
# Valid settings run: a list (the first level counts), the limit itself, and --threads overriding
# the environment.
expect_ok env OMP_NUM_THREADS=2,1 "$ATTNSCOPE" locality --dump d.h5 --out ok1
expect_grep '"threads": 2' ok1/locality.json
expect_ok "$ATTNSCOPE" locality --dump d.h5 --out ok2 --threads 1024 --images 0 --layers 0
expect_ok env OMP_NUM_THREADS=100000 "$ATTNSCOPE" locality --dump d.h5 --out ok3 --threads 3
expect_grep '"threads": 3' ok3/locality.json

# Stray positional arguments, in every command that takes no positional argument.
for a in "${analyses[@]}" "${others[@]}"; do
  read -r -a cmd <<<"$a"
  read -r -a dump <<<"$(dump_of "${cmd[0]}")"
  cmd+=("${dump[@]}" --out "$(out_of "${cmd[0]}")")
  expect_exit 2 "unexpected argument 'linear:relu'" "$ATTNSCOPE" "${cmd[@]}" --threads 1 linear:relu
  expect_exit 2 "unexpected argument 'extra'" "$ATTNSCOPE" "${cmd[@]:0:1}" extra "${cmd[@]:1}"
  expect_no_file r t.h5
done
for a in "${analyses[@]}"; do
  read -r -a cmd <<<"$a"
  [ "${cmd[0]}" = recompute ] && continue
  expect_exit 2 "unexpected argument 'linear:relu'" "$ATTNSCOPE" "${cmd[@]}" --dump d.h5 --out r \
    --variant softmax linear:relu
  expect_no_file r
done

# Empty values: every string flag, each named in the error.
for a in "${analyses[@]}"; do
  read -r -a cmd <<<"$a"
  expect_exit 2 "--dump was given an empty value" "$ATTNSCOPE" "${cmd[@]}" --dump "" --out r
  expect_exit 2 "--out was given an empty value" "$ATTNSCOPE" "${cmd[@]}" --dump d.h5 --out ""
  for flag in --variant --images --layers --heads; do
    [ "${cmd[0]}" = recompute ] && [ "$flag" != --images ] && continue
    expect_exit 2 "$flag was given an empty value" "$ATTNSCOPE" "${cmd[@]}" --dump d.h5 --out r "$flag" ""
    expect_exit 2 "$flag" "$ATTNSCOPE" "${cmd[@]}" --dump d.h5 --out r "$flag="
  done
  expect_no_file r results
done
expect_exit 2 "--tokens was given an empty value" "$ATTNSCOPE" maps --dump d.h5 --tokens "" --out r
expect_exit 2 "--transform was given an empty value" "$ATTNSCOPE" locality --dump d.h5 --transform "" --out r
for flag in --scales --keys --tokens --scale-space; do
  expect_exit 2 "$flag was given an empty value" "$ATTNSCOPE" spikiness --synthetic "$flag" "" --out r
done
expect_exit 2 "--out was given an empty value" "$ATTNSCOPE" synth --out ""
expect_exit 2 "--model-name was given an empty value" "$ATTNSCOPE" synth --out t.h5 --model-name ""
expect_exit 2 "--out was given an empty value" "$ATTNSCOPE" verify --out ""
expect_exit 2 "--file was given an empty value" "$ATTNSCOPE" info ""
expect_no_file r t.h5

# Repeated or empty list items: the same variant twice (also spelled two ways), an index twice,
# a scale twice; an empty item anywhere.
for a in "${analyses[@]}"; do
  read -r -a cmd <<<"$a"
  [ "${cmd[0]}" = recompute ] && continue
  cmd+=(--dump d.h5)
  expect_exit 2 "variant 'softmax@paper' repeats 'softmax' (both are softmax@paper)" \
    "$ATTNSCOPE" "${cmd[@]}" --out r --variant softmax,softmax@paper
  expect_exit 2 "variant 'mala:elu1@paper' repeats 'mala' (both are mala:elu1@paper)" \
    "$ATTNSCOPE" "${cmd[@]}" --out r --variant mala,mala:elu1@paper
  expect_exit 2 "empty variant spec" "$ATTNSCOPE" "${cmd[@]}" --out r --variant softmax,
  expect_exit 2 "--heads: index 1 is listed twice" "$ATTNSCOPE" "${cmd[@]}" --out r --heads 0-1,1
  expect_exit 2 "--layers: expected an index" "$ATTNSCOPE" "${cmd[@]}" --out r --layers 0,
  expect_no_file r
done
expect_exit 2 "--images: index 0 is listed twice" "$ATTNSCOPE" recompute --dump d.h5 --out r --images 0,0
expect_exit 2 "--tokens: token 5 is listed twice" "$ATTNSCOPE" maps --dump d.h5 --out r --tokens 5,5
expect_exit 2 "--tokens: token 8 is listed twice (again as '1:0')" "$ATTNSCOPE" maps --dump d.h5 --out r --tokens 8,1:0
expect_exit 2 "factor 2 is listed twice" "$ATTNSCOPE" spikiness --synthetic --out r --scales 1,2,2
expect_exit 2 "HIGH and LOW are the same key ('top')" "$ATTNSCOPE" spikiness --synthetic --out r --keys top,top
expect_no_file r
expect_exit 2 "--synth-images must be >= 1, got 0" "$ATTNSCOPE" spikiness --synthetic --synth-images 0 --out r
expect_no_file r
