# A random-weight DFlash drafter of the default shape for Qwen2.5-Coder-1.5B (for timing only).
import json, os, random, struct, array
out = "/tmp/rd/drafter"; os.makedirs(out, exist_ok=True)
H, L, NH, KV, HD, I = 1536, 2, 8, 2, 128, 1024
taps = [1, 13, 25]
cfg = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "attention_bias": False,
       "block_size": 16, "dflash_config": {"block_size": 16, "mask_token_id": 151665, "target_layer_ids": taps},
       "head_dim": HD, "hidden_act": "silu", "hidden_size": H, "intermediate_size": I,
       "layer_types": ["full_attention"] * L, "max_position_embeddings": 32768,
       "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": KV,
       "num_target_layers": 28, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000.0,
       "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 151936}
json.dump(cfg, open(f"{out}/config.json", "w"), indent=2)
shapes = {"fc.weight": [H, len(taps) * H], "hidden_norm.weight": [H], "norm.weight": [H]}
for l in range(L):
    p = f"layers.{l}."
    shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
        p + "self_attn.q_proj.weight": [NH * HD, H], p + "self_attn.k_proj.weight": [KV * HD, H],
        p + "self_attn.v_proj.weight": [KV * HD, H], p + "self_attn.o_proj.weight": [H, NH * HD],
        p + "self_attn.q_norm.weight": [HD], p + "self_attn.k_norm.weight": [HD],
        p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I]})
rng = random.Random(0)
# bf16 pool of small values (0.02 scale), tiled for speed
def bf16(x): return struct.unpack("<I", struct.pack("<f", x))[0] >> 16
pool = array.array("H", [bf16(rng.gauss(0, 0.02)) for _ in range(1 << 16)])
one = bf16(1.0)
header, blobs, off = {}, [], 0
for name, shp in shapes.items():
    n = 1
    for s in shp: n *= s
    if name.endswith("norm.weight"):
        a = array.array("H", [one]) * n
    else:
        reps = n // len(pool) + 1
        a = (pool * reps)[:n]
    b = a.tobytes(); header[name] = {"dtype": "BF16", "shape": shp, "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode(); h += b" " * ((8 - len(h) % 8) % 8)
with open(f"{out}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h)
    for b in blobs: f.write(b)
print(off / 1e6, "MB")
