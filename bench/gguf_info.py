"""What one decode step must read from a GGUF file: a small stdlib-only GGUF reader.

    python3 bench/gguf_info.py MODEL.gguf        # prints the summary as JSON

Bytes per decode step (the numerator of the bandwidth ceiling):
  weights  = every tensor's bytes, minus the token-embedding table (a step reads one row of
             it), plus the table again when there is no `output.weight` (the head is tied to
             the embedding and reads all of it);
  cache    = at context length L: L x (K rows + V rows) x element size, summed over the layers
             that have `attn_k.weight` (f16 for llama.cpp's default cache, f32 for kasoku's),
             plus the recurrent state of Gated DeltaNet / SSM layers (f32), read once a step.
Tensor sizes come from the type's block layout (ggml's table); MTP tensors (`mtp.*`) are left out.
"""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

# ggml type id -> (name, values per block, bytes per block)
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2),
}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        b = self.f.read(size)
        if len(b) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, b)[0]

    def string(self) -> str:
        n = self.take("<Q")
        if n > 1 << 24:
            raise ValueError("implausible string length in GGUF header")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype: int, keep: bool = True):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, n = self.take("<I"), self.take("<Q")
            if itype in _SCALARS and not keep:  # skip big numeric arrays quickly
                self.f.seek(struct.calcsize(_SCALARS[itype]) * n, 1)
                return None
            items = [self.value(itype, keep) for _ in range(n)]
            return items if keep else None
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf(path: str | Path) -> dict:
    """{'version', 'metadata' (small values only), 'tensors': [{'name','type','shape','nbytes','offset'}]}
    ('offset': where the tensor's bytes start in the file)."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.take("<I")
        if version < 2:
            raise ValueError(f"{path}: GGUF v{version} is not supported")
        n_tensors, n_kv = r.take("<Q"), r.take("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.take("<I")
            # Token lists and merges are large: read past them without keeping them.
            keep = not key.startswith("tokenizer.ggml.") or vtype != 9
            v = r.value(vtype, keep)
            if keep:
                meta[key] = v
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            nd = r.take("<I")
            ne = [r.take("<Q") for _ in range(nd)]
            ttype = r.take("<I")
            offset = r.take("<Q")  # within the data section
            tname, blk, bbytes = GGML_TYPES.get(ttype, (f"type{ttype}", 1, 0))
            n = 1
            for d in ne:
                n *= d
            tensors.append({"name": name, "type": tname, "shape": ne[::-1], "nbytes": n // blk * bbytes,
                            "offset": offset})
        align = meta.get("general.alignment", 32)
        data = (f.tell() + align - 1) // align * align
        for t in tensors:
            t["offset"] += data
    return {"version": version, "metadata": meta, "tensors": tensors}


def decode_bytes(path: str | Path) -> dict:
    g = read_gguf(path)
    meta, tensors = g["metadata"], [t for t in g["tensors"] if not t["name"].startswith("mtp.")]
    arch = meta.get("general.architecture", "?")
    by_name = {t["name"]: t for t in tensors}
    total = sum(t["nbytes"] for t in tensors)
    embd = by_name.get("token_embd.weight")
    embd_bytes = embd["nbytes"] if embd else 0
    embd_row = embd_bytes // embd["shape"][0] if embd else 0
    tied = "output.weight" not in by_name
    weights = total - embd_bytes + embd_row + (embd_bytes if tied else 0)
    by_type: dict[str, int] = {}
    for t in tensors:
        by_type[t["type"]] = by_type.get(t["type"], 0) + t["nbytes"]

    layers = int(meta.get(f"{arch}.block_count", 0) or 0)
    kv_elems = 0  # K + V values per position over all attention layers
    attn_layers = 0
    for i in range(layers):
        k, v = by_name.get(f"blk.{i}.attn_k.weight"), by_name.get(f"blk.{i}.attn_v.weight")
        if k and v:
            attn_layers += 1
            kv_elems += k["shape"][0] + v["shape"][0]
    # Recurrent layers (Qwen3.5 / Qwen3-Next Gated DeltaNet): state d_state x d_inner f32, plus the
    # conv window (kernel - 1) x conv channels.
    rec_layers = sum(1 for i in range(layers) if f"blk.{i}.ssm_conv1d.weight" in by_name)
    rec_bytes = 0
    if rec_layers:
        d_state = int(meta.get(f"{arch}.ssm.state_size", 0) or 0)
        d_inner = int(meta.get(f"{arch}.ssm.inner_size", 0) or 0)
        k = int(meta.get(f"{arch}.ssm.conv_kernel", 4) or 4)
        conv = next(by_name[f"blk.{i}.ssm_conv1d.weight"] for i in range(layers)
                    if f"blk.{i}.ssm_conv1d.weight" in by_name)
        conv_ch = conv["shape"][0]
        rec_bytes = rec_layers * (d_state * d_inner + (k - 1) * conv_ch) * 4
    return {
        "file": str(path),
        "file_bytes": Path(path).stat().st_size,
        "architecture": arch,
        "name": meta.get("general.name"),
        "file_type": meta.get("general.file_type"),
        "layers": layers,
        "attention_layers": attn_layers,
        "recurrent_layers": rec_layers,
        "tensor_bytes": total,
        "tensor_bytes_by_type": dict(sorted(by_type.items())),
        "tied_head": tied,
        "weights_per_token": weights,
        "kv_values_per_position": kv_elems,
        "kv_bytes_per_position_f16": kv_elems * 2,
        "kv_bytes_per_position_f32": kv_elems * 4,
        "recurrent_state_bytes": rec_bytes,
    }


def bytes_per_token(info: dict, context: int, kv_elem_bytes: int = 2) -> int:
    """Bytes one decode step reads at `context` positions (cache elements of kv_elem_bytes)."""
    return info["weights_per_token"] + info["kv_values_per_position"] * kv_elem_bytes * context \
        + info["recurrent_state_bytes"]


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(json.dumps(decode_bytes(p), indent=2))
