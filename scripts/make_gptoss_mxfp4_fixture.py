#!/usr/bin/env python3
"""Make tests/fixtures/families/gpt-oss-mxfp4/: the tiny gpt-oss fixture with its experts in
MXFP4, laid out as OpenAI ships gpt-oss on Hugging Face (openai/gpt-oss-20b, -120b), plus
transformers' reference logits for that directory.

Source: tests/fixtures/families/gpt-oss (make_family_fixtures.py). Written:

  config.json              the source's, with "quantization_config": {"quant_method": "mxfp4",
                           "modules_to_not_convert": [...]} as in OpenAI's configs
  model.safetensors        every tensor as in the source (f32), except per layer N:
                             model.layers.N.mlp.experts.gate_up_proj_blocks  U8 (E, 2I, H/32, 16)
                             model.layers.N.mlp.experts.gate_up_proj_scales  U8 (E, 2I, H/32)
                             model.layers.N.mlp.experts.down_proj_blocks     U8 (E, H, I/32, 16)
                             model.layers.N.mlp.experts.down_proj_scales     U8 (E, H, I/32)
                             model.layers.N.mlp.experts.{gate_up,down}_proj_bias  BF16
                           in place of the f32 gate_up_proj (E, H, 2I) / down_proj (E, I, H)
                           and their f32 biases
  generation_config.json, tokenizer.json, tokenizer_config.json   copied
  ref.safetensors          REF file (flowrt-ref/1): the source's prompts, logits computed by
                           transformers loading this directory (MXFP4 dequantised on CPU into
                           float32 parameters: dtype=torch.float32), eager attention, 1 thread

The layout, as transformers' integrations/mxfp4.py (_convert_moe_packed_tensors) reads it:
a blocks tensor's rows are the matrix's output features (for gate_up: 2I rows, gate at even
rows and up at odd rows, as GptOssExperts._apply_gate takes gate_up[..., ::2] and [..., 1::2]
after the transpose), each row split into blocks of 32 consecutive input features; byte k of
a block holds element 2k in its low nibble and element 2k + 1 in its high nibble, a code of
the E2M1 table FP4_VALUES (0, .5, 1, 1.5, 2, 3, 4, 6, then the same negated); the block's
scale byte s gives the factor 2^(s - 127).

Quantiser (our own): per block of 32 the power-of-two scale 2^(floor(log2(amax)) - 2) (so the
largest magnitude lands in [4, 8) over it, as ggml and OpenAI's reference quantiser choose),
each element the nearest E2M1 value (ties to the smaller magnitude). Seedless: the result is a
function of the source fixture. The script checks that transformers' dequantised experts equal
its own dequantisation of the bytes exactly, and prints sha256 sums.
"""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_reference import FORMAT_VERSION, write_safetensors  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests/fixtures/families/gpt-oss"
OUT = ROOT / "tests/fixtures/families/gpt-oss-mxfp4"

# transformers' FP4_VALUES (integrations/mxfp4.py): code -> E2M1 value.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
# Midpoints between the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)

QUANT_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (..., K), K a multiple of 32, rows = output features -> (blocks (..., K/32, 16) U8,
    scales (..., K/32) U8) in OpenAI's layout."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    b = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        ex = np.where(amax > 0, np.floor(np.log2(amax)) - 2, -127)
    ex = np.clip(ex, -126, 127)
    scales = (ex + 127).astype(np.uint8)[..., 0]
    y = b / np.exp2(ex).astype(np.float32)
    ay = np.abs(y)
    mag = np.zeros(ay.shape, dtype=np.uint8)
    for m in MIDPOINTS:
        mag += ay > m
    codes = np.where((y < 0) & (mag > 0), mag + 8, mag).astype(np.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.astype(np.uint8), scales


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """The inverse, as transformers reads it: (..., G, 16), (..., G) -> (..., G * 32)."""
    lo = FP4_VALUES[blocks & 0x0F]
    hi = FP4_VALUES[blocks >> 4]
    v = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)
    v = v * np.exp2(scales.astype(np.float32) - 127)[..., None]
    return v.reshape(*blocks.shape[:-2], -1)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16).view(
        torch.int16).numpy().astype("<i2").view(np.uint16)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    import torch
    import transformers
    from safetensors import safe_open
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    OUT.mkdir(parents=True, exist_ok=True)
    for f in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(SRC / f, OUT / f)
    cfg = json.loads((SRC / "config.json").read_text())
    cfg["quantization_config"] = QUANT_CONFIG
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    src = load_file(str(SRC / "model.safetensors"))
    tensors = []
    deq = {}
    worst = 0.0
    for name in sorted(src):
        a = src[name]
        if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
            # HF parameter (E, in, out) -> rows = output features, (E, out, in).
            rows = np.transpose(a, (0, 2, 1))
            blocks, scales = quantize(rows)
            back = dequantize(blocks, scales)
            rel = float(np.linalg.norm(back - rows) / np.linalg.norm(rows))
            worst = max(worst, rel)
            deq[name] = np.transpose(back, (0, 2, 1))
            tensors.append((f"{name}_blocks", blocks, "U8"))
            tensors.append((f"{name}_scales", scales, "U8"))
        elif name.endswith("_proj_bias") and ".mlp.experts." in name:
            tensors.append((name, bf16_bits(a), "BF16"))
        else:
            tensors.append((name, np.ascontiguousarray(a, dtype="<f4"), "F32"))
    tensors.sort(key=lambda t: t[0])
    write_safetensors(OUT / "model.safetensors", tensors, {"format": "pt"})
    print(f"MXFP4 experts: worst relative error of a quantised tensor {worst:.3f}")

    lm = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32,
                                              attn_implementation="eager").eval()
    # transformers' dequantised experts must be exactly ours (float32 parameters).
    for name, want in deq.items():
        got = lm.get_parameter(name)
        if got.dtype != torch.float32:
            raise SystemExit(f"{name}: transformers dequantised to {got.dtype}, not float32")
        if not np.array_equal(got.detach().numpy(), want):
            raise SystemExit(f"{name}: transformers' dequantisation differs from this script's")
    print(f"transformers' dequantised experts equal this script's ({len(deq)} tensors, float32)")

    ref_src = safe_open(str(SRC / "ref.safetensors"), "np")
    n = int(ref_src.metadata()["n_prompts"])
    prompts = [ref_src.get_tensor(f"prompt.{i}.input_ids").tolist() for i in range(n)]
    out, kl_vs_float = [], []
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            logits = lm(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        f = torch.from_numpy(ref_src.get_tensor(f"prompt.{i}.logits_all"))
        kl = torch.nn.functional.kl_div(logits.log_softmax(-1), f.log_softmax(-1), log_target=True,
                                        reduction="none").sum(-1)
        kl_vs_float.append(float(kl.mean()))
        out.append((f"prompt.{i}.input_ids", np.asarray(ids, dtype="<i8"), "I64"))
        out.append((f"prompt.{i}.logits_all", logits.numpy().astype("<f4"), "F32"))
    print("mean KL(float fixture || MXFP4 fixture) per prompt: " + ", ".join(f"{k:.3e}" for k in kl_vs_float))
    meta = {
        "format": FORMAT_VERSION,
        "model": "tests/fixtures/families/gpt-oss-mxfp4",
        "model_format": "hf",
        "architecture": "GptOssForCausalLM",
        "generator": "scripts/make_gptoss_mxfp4_fixture.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": "1",
        "compute_dtype": "f32 (MXFP4 experts dequantised by transformers into float32 parameters)",
        "logits_dtype": "f32",
        "attn_implementation": "eager",
        "n_prompts": str(n),
        "prompts": "the prompts of tests/fixtures/families/gpt-oss/ref.safetensors",
        "prompt_token_counts": json.dumps([len(p) for p in prompts]),
        "total_token_counts": json.dumps([len(p) for p in prompts]),
        "append_greedy": json.dumps([0] * n),
        "reference_run": "one forward per prompt",
        "vocab_size": str(cfg["vocab_size"]),
        "model_files": f"{sha256(OUT / 'model.safetensors')}  model.safetensors\n",
    }
    write_safetensors(OUT / "ref.safetensors", out, meta)
    for f in sorted(OUT.iterdir()):
        print(f"{sha256(f)[:16]}  {f.stat().st_size:>8}  {f.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
