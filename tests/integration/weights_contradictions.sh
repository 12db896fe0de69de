# A weights file that contradicts itself is refused by replay, naming the two places that
# disagree (was: depth = 3 with 4 blocks stored ran 3 blocks, scale = 1.0 was used where the
# Python loader computes with head_dim^-0.5, config_json was never compared, a wrong num_tokens,
# weights_dtype or an extra block passed, a NaN layer_norm_eps named no file).
need_h5py
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$REPO/data/models/vit7-softmax-fmnist.h5"
dump="$REPO/data/dumps/vit7-softmax-fmnist.h5"
# edited NAME PYTHON: a copy of the softmax model as $WORK/NAME.h5, changed by PYTHON (f = the file)
edited() {
  cp "$src" "$WORK/$1.h5"
  "$PYTHON" -c "import h5py, json, numpy as np
with h5py.File('$WORK/$1.h5', 'r+') as f:
    cfg = json.loads(f.attrs['config_json'])
    $2"
}
refused() {  # refused NAME "message"
  expect_exit 1 "$WORK/$1.h5: $2" "$ATTNSCOPE" replay --model "$WORK/$1.h5" --dump "$dump" --images 0-1 \
    --out "$WORK/out-$1"
  expect_no_file "$WORK/out-$1/replay.json"
}
expect_ok "$ATTNSCOPE" replay --model "$src" --dump "$dump" --images 0-1 --out "$WORK/good"

edited depth3 "f.attrs['depth'] = 3"
refused depth3 "attribute 'config_json': expected \"depth\" to agree with attribute 'depth' (3), found 4"
edited depth3cfg "f.attrs['depth'] = 3; cfg['depth'] = 3; f.attrs['config_json'] = json.dumps(cfg)"
refused depth3cfg "/blocks: expected 3 blocks (/blocks/0 to /blocks/2) as attribute 'depth' says, found 4 entries"
edited extra "f.copy('blocks/3', 'blocks/4')"
refused extra "/blocks: expected 4 blocks (/blocks/0 to /blocks/3) as attribute 'depth' says, found 5 entries"
edited scale1 "f.attrs['scale'] = 1.0"
refused scale1 "attribute 'scale': expected head_dim^-0.5 = 0.176776695 (attribute 'head_dim' is 32"
edited family "cfg['family'] = 'linear'; f.attrs['config_json'] = json.dumps(cfg)"
refused family "attribute 'config_json': expected \"family\" to agree with attribute 'attention_family' (softmax), found \"linear\""
edited classes "cfg['num_classes'] = 11; f.attrs['config_json'] = json.dumps(cfg)"
refused classes "attribute 'config_json': expected \"num_classes\" to agree with attribute 'num_classes' (10), found 11"
edited notjson "f.attrs['config_json'] = '{depth'"
refused notjson "attribute 'config_json': expected a JSON object"
edited tokens "f.attrs['num_tokens'] = 49"
refused tokens "attribute 'num_tokens': expected prefix_tokens + grid_height x grid_width = 50, found 49"
edited dtype16 "f.attrs['weights_dtype'] = 'float16'"
refused dtype16 "/patch_embed/proj/weight: expected float16 as attribute 'weights_dtype' says, found float32"
edited bf16 "f.attrs['weights_dtype'] = 'bfloat16'"
refused bf16 "attribute 'weights_dtype': expected float32 or float16, found 'bfloat16'"
edited epsnan "f.attrs['layer_norm_eps'] = float('nan')"
refused epsnan "attribute 'layer_norm_eps': expected a positive finite float, found nan"
edited epsneg "f.attrs['layer_norm_eps'] = -1e-6"
refused epsneg "attribute 'layer_norm_eps': expected a positive finite float, found -1e-06"
# A file with one tensor stored as float16 while weights_dtype says float32.
edited mixed "
    x = f['blocks/0/attn/proj/weight'][...]; del f['blocks/0/attn/proj/weight']
    f['blocks/0/attn/proj/weight'] = x.astype(np.float16)"
refused mixed "/blocks/0/attn/proj/weight: expected float32 as attribute 'weights_dtype' says, found float16"
# Negative control: every tensor float16 and weights_dtype saying so loads and runs.
edited all16 "
    names = []
    f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    for n in names:
        x = f[n][...]; del f[n]; f[n] = x.astype(np.float16)
    f.attrs['weights_dtype'] = 'float16'"
expect_ok "$ATTNSCOPE" replay --model "$WORK/all16.h5" --dump "$dump" --images 0-1 --out "$WORK/out-all16"
