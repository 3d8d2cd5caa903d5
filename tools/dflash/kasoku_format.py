"""Reads a checkpoint written by `kasoku quantize` back into dense float tensors, so that a
drafter shipped in kasoku's own formats (drafters/*/, format M) can seed the next training
window (`train.py --init DIR`).

The format is defined by crates/kasoku/src/quant/kasoku/ (mod.rs, m4.rs, l8.rs, rotation.rs);
this is an independent reading of it in numpy:
- the safetensors metadata `kasoku.tensors` maps a matrix's name to its spec
  `{"format": "M"|"L", "group": G|"row", "rotation": {"block": b, "seed": s}|null,
  "shape": [rows, cols]}`; its bytes are the tensors `NAME.codes`, `NAME.scales` and (M only)
  `NAME.zeros`, one row of each per matrix row;
- M: 4-bit codes (even column in the low nibble), per group an f16 scale and a 4-bit zero
  point (even group low): `w = s·(q − z)`; L: i8 codes, an f16 scale per 32 columns or one f32
  scale per row: `w = s·q`;
- values are in the rotated basis `W·Rᵀ`, `R = diag(H_b, …)·D`: `D` flips column j's sign when
  bit j % 64 of SplitMix64's (j / 64)-th output from the seed is set, `H_b` is the
  Sylvester-ordered Walsh–Hadamard matrix over blocks of b columns, normalised by 1/√b. So the
  original row is `D·H_b·row / √b` block by block (H_b is symmetric and H_b² = b·I).

Other tensors (norms) are stored as they were and returned as they are.
"""
from __future__ import annotations

import json
import struct

import numpy as np

MASK64 = (1 << 64) - 1


def signs(seed: int, cols: int) -> np.ndarray:
    """±1 per column, from SplitMix64 started at `seed`."""
    out = np.empty(cols, np.float64)
    state = seed
    for w in range((cols + 63) // 64):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        z ^= z >> 31
        for j in range(w * 64, min(cols, w * 64 + 64)):
            out[j] = -1.0 if (z >> (j % 64)) & 1 else 1.0
    return out


def hadamard(b: int) -> np.ndarray:
    """The b-point Walsh–Hadamard matrix in Sylvester order (unnormalised)."""
    h = np.ones((1, 1))
    while h.shape[0] < b:
        h = np.block([[h, h], [h, -h]])
    return h


def unrotate(values: np.ndarray, block: int, seed: int) -> np.ndarray:
    """Rows stored in the rotated basis, back in the original one (float64)."""
    rows, cols = values.shape
    blocks = values.reshape(rows, cols // block, block) @ hadamard(block) / np.sqrt(block)
    return blocks.reshape(rows, cols) * signs(seed, cols)


def dequantize(spec: dict, parts: dict[str, np.ndarray]) -> np.ndarray:
    """One matrix from its spec and its parts' raw bytes (uint8 arrays, one row per matrix
    row), in the original basis, float32."""
    rows, cols = spec["shape"]
    codes = parts["codes"].reshape(rows, -1)
    if spec["format"] == "M":
        group = spec["group"]
        q = np.empty((rows, cols), np.float64)
        q[:, 0::2] = codes & 15
        q[:, 1::2] = codes >> 4
        zb = parts["zeros"].reshape(rows, -1)
        groups = cols // group
        z = np.empty((rows, zb.shape[1] * 2), np.float64)
        z[:, 0::2] = zb & 15
        z[:, 1::2] = zb >> 4
        s = parts["scales"].reshape(rows, -1).copy().view(np.float16).astype(np.float64)
        w = (q.reshape(rows, groups, group) - z[:, :groups, None]) * s[:, :, None]
        w = w.reshape(rows, cols)
    elif spec["format"] == "L":
        q = codes.view(np.int8).astype(np.float64)
        sb = parts["scales"].reshape(rows, -1).copy()
        if spec["group"] == "row":
            w = q * sb.view(np.float32).astype(np.float64)
        else:
            s = sb.view(np.float16).astype(np.float64)
            w = (q.reshape(rows, -1, 32) * s[:, :, None]).reshape(rows, cols)
    else:
        raise ValueError(f"unknown kasoku format {spec['format']!r}")
    rot = spec.get("rotation")
    if rot:
        w = unrotate(w, rot["block"], rot["seed"])
    return w.astype(np.float32)


def read(data: bytes) -> dict[str, "torch.Tensor"]:
    """Every tensor of a safetensors file's bytes, kasoku's matrices dequantized (float32);
    a file without kasoku metadata is read as plain safetensors."""
    import torch
    from safetensors.torch import load as load_bytes
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    specs = json.loads(header.get("__metadata__", {}).get("kasoku.tensors", "{}"))
    raw = load_bytes(data)
    out = {}
    for name, spec in specs.items():
        parts = {p: raw.pop(f"{name}.{p}").contiguous().view(torch.uint8).numpy()
                 for p in ("codes", "scales", "zeros") if f"{name}.{p}" in raw}
        out[name] = torch.from_numpy(dequantize(spec, parts))
    out.update(raw)
    return out
