# Every family of the registry (`attnscope info --families`) computed from q and k alone through
# every analysis on a synthetic dump of its own (the code convention, whose InLine and MALA rows
# are O(1/N) as in real models); the families that need per-layer model data ("layer data" in
# their block) run in field_families_cli.sh on dumps that carry it:
# confusion (fast counts equal to --reference, at a radius wide enough that the counts are not all
# zero), locality, maps, census, spikiness, distance, entropy, sinks, rank and rollout (fast against --reference). No family is named here: a family
# added to the registry is run by this test as it is.
need_h5py

expect_ok "$ATTNSCOPE" info --families
cp "$WORK/out.txt" "$WORK/families.txt"
families=$(grep -E '^[a-z]' "$WORK/families.txt")
[ "$(echo "$families" | wc -l)" -ge 6 ] || { echo "FAIL: info --families: $families"; exit 1; }
for family in $families; do
  awk -v f="$family" '$0 == f { on = 1; next } /^[a-z]/ { on = 0 } on && /layer data/ { found = 1 } END { exit !found }' \
    "$WORK/families.txt" && continue
  rule=$(awk -v f="$family" '$0 == f {getline; print $3; exit}' "$WORK/families.txt")
  case "$rule" in
    none) map=none; spec=$family ;;
    required) map=relu; spec=$family:relu ;;
    default) map=$(awk -v f="$family" '$0 == f {getline; print $4; exit}' "$WORK/families.txt"); spec=$family ;;
    *) echo "FAIL: $family: feature map rule '$rule'"; exit 1 ;;
  esac
  d="$WORK/$family"
  expect_ok "$ATTNSCOPE" synth --out "$d.h5" --images 2 --layers 2 --heads 2 --family "$family" \
    --feature-map "$map" --convention code --plant-duplicates 2 --plant-collinear 2 --seed 5
  # The dump's own variant is the default everywhere.
  expect_ok "$ATTNSCOPE" confusion --dump "$d.h5" --out "$d/fast" --eps 0.2
  expect_ok "$ATTNSCOPE" confusion --dump "$d.h5" --out "$d/ref" --eps 0.2 --reference
  expect_grep "^$family" "$d/fast/confusion_per_image.csv"
  cmp "$d/fast/confusion_per_image.csv" "$d/ref/confusion_per_image.csv" ||
    { echo "FAIL: $spec: fast and reference confusion counts differ"; exit 1; }
  total=$(awk -F, 'NR > 1 { s += $3 } END { print s + 0 }' "$d/fast/confusion_per_image.csv")
  [ "$total" -gt 0 ] || { echo "FAIL: $spec: no confused pair at eps 0.2, nothing compared"; exit 1; }
  expect_ok "$ATTNSCOPE" locality --dump "$d.h5" --out "$d/loc"
  expect_grep "^$family" "$d/loc/locality.csv"
  expect_ok "$ATTNSCOPE" maps --dump "$d.h5" --out "$d/maps" --images 0 --tokens 3
  expect_grep "^$family" "$d/maps/maps.csv"
  expect_ok "$ATTNSCOPE" census --dump "$d.h5" --out "$d/census" --variant "$spec"
  expect_grep "^$family" "$d/census/census.csv"
  expect_ok "$ATTNSCOPE" spikiness --dump "$d.h5" --out "$d/spk" --variant "$spec" --samples 8 --scales 0.5:4:5
  expect_grep "^$family.*,PASS$" "$d/spk/spikiness_laws.csv"
  # Fast against --reference: within 1e-9 relative; softmax heads take the float path of the
  # per-head diagnostics, within its measured tolerance 1e-6.
  tol=1e-9; [ "$family" = softmax ] && tol=1e-6
  expect_ok "$ATTNSCOPE" distance --dump "$d.h5" --out "$d/dist"
  expect_ok "$ATTNSCOPE" distance --dump "$d.h5" --out "$d/dist-ref" --reference
  expect_grep "^$family" "$d/dist/distance.csv"
  paste -d, "$d/dist/distance.csv" "$d/dist-ref/distance.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $4 - $18;
    if (e * e > t * t * (1 + $18 * $18)) { print "FAIL: " s ": distance " $4 " vs reference " $18; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" entropy --dump "$d.h5" --out "$d/ent"
  expect_ok "$ATTNSCOPE" entropy --dump "$d.h5" --out "$d/ent-ref" --reference
  expect_grep "^$family" "$d/ent/entropy.csv"
  paste -d, "$d/ent/entropy.csv" "$d/ent-ref/entropy.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $4 - $18;
    if (e * e > t * t * (1 + $18 * $18)) { print "FAIL: " s ": entropy " $4 " vs reference " $18; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" sinks --dump "$d.h5" --out "$d/sinks"
  expect_ok "$ATTNSCOPE" sinks --dump "$d.h5" --out "$d/sinks-ref" --reference
  expect_grep "^$family" "$d/sinks/sinks.csv"
  paste -d, "$d/sinks/sinks_keys.csv" "$d/sinks-ref/sinks_keys.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 { e = $7 - $15;
    if (e * e > t * t * (1 + $15 * $15) || $8 != $16) { print "FAIL: " s ": sinks " $0; exit 1 } }' || exit 1
  expect_ok "$ATTNSCOPE" rank --dump "$d.h5" --out "$d/rank"
  expect_ok "$ATTNSCOPE" rank --dump "$d.h5" --out "$d/rank-ref" --reference
  expect_grep "^$family" "$d/rank/rank.csv"
  paste -d, "$d/rank/rank.csv" "$d/rank-ref/rank.csv" | awk -F, -v s="$spec" 'NR > 1 && ($5 != $38 || $8 - $41 > 1e-8 || $41 - $8 > 1e-8) {
    print "FAIL: " s ": rank " $5 "/" $8 " vs reference " $38 "/" $41; exit 1 }' || exit 1
  expect_ok "$ATTNSCOPE" rollout --dump "$d.h5" --out "$d/roll"
  expect_ok "$ATTNSCOPE" rollout --dump "$d.h5" --out "$d/roll-ref" --reference
  expect_grep "^$family" "$d/roll/rollout.csv"
  paste -d, "$d/roll/rollout.csv" "$d/roll-ref/rollout.csv" | awk -F, -v s="$spec" -v t="$tol" 'NR > 1 && ($6 - $12 > t || $12 - $6 > t) {
    print "FAIL: " s ": rollout " $0; exit 1 }' || exit 1
done
