#!/usr/bin/env python3
"""gen_lora_seeds.py — writes the seed corpus of fuzz_lora_adapter (corpus/lora_adapter/).

Run from anywhere: python3 tests/fuzz/gen_lora_seeds.py. The seeds are committed; this script
documents how they were made. Each seed is <u32 config length><adapter_config.json>
<adapter_model.safetensors> for the harness's base (dim 16, 2 layers, 4 heads, 2 KV heads,
head_dim 4, ffn 24): valid adapters (every target, f16/bf16, layers_to_transform) and
near-misses (a wrong shape, rank, layer, name, a missing B). Standard library only.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "corpus", "lora_adapter")

DIMS = {  # module: (parent, in, out)
    "q_proj": ("self_attn", 16, 16), "k_proj": ("self_attn", 16, 8),
    "v_proj": ("self_attn", 16, 8), "o_proj": ("self_attn", 16, 16),
    "gate_proj": ("mlp", 16, 24), "up_proj": ("mlp", 16, 24), "down_proj": ("mlp", 24, 16),
}
FMT = {"F32": ("<f", 4), "F16": ("<e", 2), "BF16": (None, 2)}


def pack(dtype, values):
    if dtype == "BF16":
        return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:]
                        for v in values)
    f, _ = FMT[dtype]
    return b"".join(struct.pack(f, v) for v in values)


def safetensors(tensors):
    """tensors: list of (name, dtype, shape, values)"""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape, values in tensors:
        b = pack(dtype, values)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def name(layer, module, ab):
    return "base_model.model.model.layers.%d.%s.%s.lora_%s.weight" % (
        layer, DIMS[module][0], module, ab)


def reshape(ts, i, shape):
    """tensor i gets `shape` (and as many values), so only the loader can object"""
    ts[i][2] = shape
    ts[i][3] = [0.25] * (shape[0] * shape[1])


def adapter(modules, r=2, dtype="F32", layers=(0, 1), extra=None, mutate=None):
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 2 * r, "target_modules": modules,
           "bias": "none", "use_dora": False, "fan_in_fan_out": False}
    if extra:
        cfg.update(extra)
    ts = []
    for layer in layers:
        for m in modules:
            _, i, o = DIMS[m]
            ts.append([name(layer, m, "A"), dtype, [r, i], [((k * 7) % 11 - 5) / 8 for k in range(r * i)]])
            ts.append([name(layer, m, "B"), dtype, [o, r], [((k * 5) % 13 - 6) / 16 for k in range(o * r)]])
    if mutate:
        mutate(ts)
    c = json.dumps(cfg).encode()
    return struct.pack("<I", len(c)) + c + safetensors(ts)


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "q_v.bin": adapter(["q_proj", "v_proj"]),
        "all.bin": adapter(list(DIMS), r=3),
        "all_linear_f16.bin": adapter(list(DIMS), dtype="F16", extra={"target_modules": "all-linear"}),
        "k_bf16_rslora.bin": adapter(["k_proj"], dtype="BF16", extra={"use_rslora": True}),
        "layer1_only.bin": adapter(["down_proj"], layers=(1,), extra={"layers_to_transform": [1]}),
        "bad_shape.bin": adapter(["q_proj"], mutate=lambda ts: reshape(ts, 0, [2, 15])),
        "bad_rank.bin": adapter(["gate_proj"], mutate=lambda ts: reshape(ts, 1, [24, 3])),
        "bad_layer.bin": adapter(["o_proj"], layers=(0, 1, 2)),
        "missing_b.bin": adapter(["up_proj"], mutate=lambda ts: ts.pop(1)),
        "foreign_name.bin": adapter(["q_proj"], mutate=lambda ts: ts.__setitem__(
            0, ["base_model.model.lm_head.lora_A.weight"] + ts[0][1:])),
    }
    for fname, data in seeds.items():
        with open(os.path.join(OUT, fname), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
