#!/usr/bin/env python3
"""Inputs for comparing flowrt's quantisers with llama.cpp's (docs/quantisation.md).

  quant_vs_llamacpp.py quantize SRC.gguf DST.gguf FTYPE [--pure]
      llama.cpp's own quantiser (llama_model_quantize, no importance matrix) from an F32/BF16
      GGUF, FTYPE as llama.cpp names it (Q4_K_M, Q5_K_M, Q6_K, Q4_0, ...); --pure puts every
      tensor in the ftype's base type instead of llama.cpp's mix. Run it with .venv-peer's
      Python (scripts/compare_peers.py --install builds llama-cpp-python there).

  quant_vs_llamacpp.py matrices-gguf MODEL.safetensors OUT.gguf
      Every 2-D f32 matrix of a safetensors file (real trained weights of any architecture)
      reshaped to rows of 768 values (3 super-blocks; quantisation is per block, so rows only
      group blocks) in a GGUF labelled llama, so llama.cpp's quantiser accepts it. Needs numpy,
      safetensors and gguf (pip install gguf).

Then `cargo run --release -p flowrt-model --example quant_error -- SRC.gguf --against DST.gguf`
prints both quantisers' relative RMS error per type on the same source values.
"""
import sys


def quantize(src, dst, ftype, pure):
    import llama_cpp

    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + ftype)
    p.pure = pure
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p)
    if rc != 0:
        sys.exit(f"llama_model_quantize {src} -> {dst} ({ftype}) failed: {rc}")


def matrices_gguf(src, dst):
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    mats = [(k, v) for k, v in sorted(load_file(src).items()) if v.ndim == 2 and v.dtype == np.float32]
    mats = [(k, v) for k, v in mats if v.size % 768 == 0]
    if not mats:
        sys.exit(f"{src}: no 2-D f32 matrix with a multiple of 768 values")
    w = gguf.GGUFWriter(dst, "llama")
    # Hyperparameters llama.cpp's loader requires; nothing runs this file.
    w.add_block_count(len(mats))
    w.add_context_length(512)
    w.add_embedding_length(768)
    w.add_feed_forward_length(768)
    w.add_head_count(6)
    w.add_head_count_kv(6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(128)
    w.add_file_type(0)
    for i, (name, v) in enumerate(mats):
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.ascontiguousarray(v.reshape(-1, 768)))
        print(f"blk.{i}.ffn_up.weight <- {name} {tuple(v.shape)}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    a = sys.argv[1:]
    if len(a) >= 4 and a[0] == "quantize":
        quantize(a[1], a[2], a[3], "--pure" in a[4:])
    elif len(a) == 3 and a[0] == "matrices-gguf":
        matrices_gguf(a[1], a[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
