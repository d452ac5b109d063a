//! `flowrt pack` from a Hugging Face checkpoint directory (llama family): GGUF names, the
//! attn_q / attn_k row permutation, llama.* hyperparameters and the tokenizer, as llama.cpp's
//! converter writes them (and `scripts/hf_to_gguf.py` does).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use flowrt_gguf::{Array, StringArray, Value};
use flowrt_model::safetensors_dir::SafetensorsDir;
use serde_json::Value as Json;

use super::SrcTensor;

/// HF name (inside `model.layers.{i}.`) -> GGUF name (inside `blk.{i}.`).
const LAYER_TENSORS: [(&str, &str); 14] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// Metadata entries and the tensors to write.
pub(crate) type Plan<'a> = (Vec<(String, Value)>, Vec<SrcTensor<'a>>);

pub(crate) struct HfSource {
    dir: PathBuf,
    cfg: Json,
    st: SafetensorsDir,
    pre: Option<String>,
}

fn read_json(path: &Path) -> Result<Json> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

impl HfSource {
    pub(crate) fn open(dir: &Path, pre: Option<&str>) -> Result<HfSource> {
        let cfg = read_json(&dir.join("config.json"))?;
        let model_type = cfg["model_type"].as_str().unwrap_or("");
        if model_type != "llama" {
            bail!(
                "{}: model_type `{model_type}`: pack converts only the llama family from HF \
                 directories for now (give a GGUF file to requantise other families)",
                dir.display()
            );
        }
        let st = SafetensorsDir::open(dir)
            .with_context(|| format!("cannot open the weights of {}", dir.display()))?;
        Ok(HfSource {
            dir: dir.to_path_buf(),
            cfg,
            st,
            pre: pre.map(str::to_string),
        })
    }

    fn usize_key(&self, key: &str) -> Result<usize> {
        self.cfg[key]
            .as_u64()
            .map(|v| v as usize)
            .with_context(|| format!("config.json: `{key}` missing or not an integer"))
    }

    /// The metadata and the tensors to write.
    pub(crate) fn plan(&self) -> Result<Plan<'_>> {
        let n_head = self.usize_key("num_attention_heads")?;
        let n_kv = self.usize_key("num_key_value_heads").unwrap_or(n_head);
        let hidden = self.usize_key("hidden_size")?;
        let head_dim = self.usize_key("head_dim").unwrap_or(hidden / n_head.max(1));
        let n_layer = self.usize_key("num_hidden_layers")?;
        let n_ff = self.usize_key("intermediate_size")?;
        let vocab = self.usize_key("vocab_size")?;
        let ctx = self.usize_key("max_position_embeddings").unwrap_or(2048);
        let eps = self.cfg["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32;
        let rp = &self.cfg["rope_parameters"];
        let rs = &self.cfg["rope_scaling"];
        let kind = rp["rope_type"]
            .as_str()
            .or(rs["rope_type"].as_str())
            .or(rs["type"].as_str())
            .unwrap_or("default");
        if kind != "default" {
            bail!("config.json: rope type `{kind}` is not supported by pack yet");
        }
        let theta = rp["rope_theta"]
            .as_f64()
            .or(self.cfg["rope_theta"].as_f64())
            .unwrap_or(10000.0) as f32;
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let a = "llama";
        let mut meta: Vec<(String, Value)> = vec![
            ("general.architecture".into(), a.into()),
            ("general.name".into(), name.into()),
            (format!("{a}.context_length"), Value::U32(ctx as u32)),
            (format!("{a}.embedding_length"), Value::U32(hidden as u32)),
            (format!("{a}.block_count"), Value::U32(n_layer as u32)),
            (format!("{a}.feed_forward_length"), Value::U32(n_ff as u32)),
            (
                format!("{a}.attention.head_count"),
                Value::U32(n_head as u32),
            ),
            (
                format!("{a}.attention.head_count_kv"),
                Value::U32(n_kv as u32),
            ),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(eps),
            ),
            (format!("{a}.rope.freq_base"), Value::F32(theta)),
            (
                format!("{a}.rope.dimension_count"),
                Value::U32(head_dim as u32),
            ),
            (
                format!("{a}.attention.key_length"),
                Value::U32(head_dim as u32),
            ),
            (
                format!("{a}.attention.value_length"),
                Value::U32(head_dim as u32),
            ),
            (format!("{a}.vocab_size"), Value::U32(vocab as u32)),
        ];
        meta.extend(self.tokenizer_metadata(vocab)?);

        let mut plan: Vec<(String, String, Option<usize>)> = vec![(
            "model.embed_tokens.weight".into(),
            "token_embd.weight".into(),
            None,
        )];
        for i in 0..n_layer {
            for (h, g) in LAYER_TENSORS {
                let hn = format!("model.layers.{i}.{h}");
                if self.st.tensors.contains_key(&hn) {
                    let perm = match g {
                        "attn_q.weight" => Some(n_head),
                        "attn_k.weight" => Some(n_kv),
                        _ => None,
                    };
                    plan.push((hn, format!("blk.{i}.{g}"), perm));
                }
            }
        }
        plan.push((
            "model.norm.weight".into(),
            "output_norm.weight".into(),
            None,
        ));
        if self.st.tensors.contains_key("lm_head.weight") {
            plan.push(("lm_head.weight".into(), "output.weight".into(), None));
        }
        let used: std::collections::HashSet<&str> = plan.iter().map(|p| p.0.as_str()).collect();
        let mut unused: Vec<&String> = self
            .st
            .tensors
            .keys()
            .filter(|k| !used.contains(k.as_str()) && !k.ends_with("rotary_emb.inv_freq"))
            .collect();
        if !unused.is_empty() {
            unused.sort();
            unused.truncate(8);
            bail!("tensors pack does not map for llama: {unused:?}");
        }
        let mut tensors = Vec::new();
        for (hn, gn, perm) in plan {
            let e = self
                .st
                .tensors
                .get(&hn)
                .with_context(|| format!("tensor `{hn}` missing from the checkpoint"))?;
            let dims: Vec<u64> = e.shape.iter().rev().map(|&d| d as u64).collect();
            tensors.push(SrcTensor {
                name: gn,
                dims,
                ty: e.dtype.clone(),
                data: self.st.bytes(e),
                permute_heads: perm,
                file_offset: e.start,
            });
        }
        Ok((meta, tensors))
    }

    /// `tokenizer.ggml.*` and `tokenizer.chat_template` from tokenizer.json and
    /// tokenizer_config.json (byte-level BPE only).
    fn tokenizer_metadata(&self, vocab_size: usize) -> Result<Vec<(String, Value)>> {
        let tj = read_json(&self.dir.join("tokenizer.json"))?;
        let model = &tj["model"];
        if model["type"].as_str() != Some("BPE") {
            bail!(
                "tokenizer.json: model type {} is not supported by pack (byte-level BPE only)",
                model["type"]
            );
        }
        let tc_path = self.dir.join("tokenizer_config.json");
        let tc = if tc_path.is_file() {
            read_json(&tc_path)?
        } else {
            Json::Null
        };
        let mut by_id: HashMap<usize, String> = HashMap::new();
        for (tok, id) in model["vocab"]
            .as_object()
            .context("tokenizer.json: no vocab")?
        {
            let id = id
                .as_u64()
                .context("tokenizer.json: a vocab id is not an integer")?;
            by_id.insert(id as usize, tok.clone());
        }
        let mut types: HashMap<usize, i32> = HashMap::new();
        for at in tj["added_tokens"].as_array().into_iter().flatten() {
            let (Some(id), Some(content)) = (at["id"].as_u64(), at["content"].as_str()) else {
                continue;
            };
            by_id.insert(id as usize, content.to_string());
            let special = at["special"].as_bool().unwrap_or(false);
            types.insert(id as usize, if special { 3 } else { 4 });
        }
        let n_tok = by_id.keys().max().map_or(0, |m| m + 1);
        if n_tok > vocab_size {
            bail!("the tokenizer has {n_tok} ids but the model's vocab_size is {vocab_size}");
        }
        let mut tokens = StringArray::new();
        let mut token_type = Vec::with_capacity(vocab_size);
        for i in 0..vocab_size {
            match by_id.get(&i) {
                Some(t) => {
                    tokens.push(t);
                    token_type.push(types.get(&i).copied().unwrap_or(1));
                }
                None => {
                    tokens.push(&format!("[PAD{i}]"));
                    token_type.push(5);
                }
            }
        }
        let mut merges = StringArray::new();
        for m in model["merges"].as_array().into_iter().flatten() {
            match m {
                Json::String(s) => merges.push(s),
                Json::Array(parts) => {
                    let parts: Vec<&str> = parts.iter().filter_map(Json::as_str).collect();
                    merges.push(&parts.join(" "));
                }
                _ => bail!("tokenizer.json: a merge is neither a string nor a pair"),
            }
        }
        let pre = match &self.pre {
            Some(p) => p.clone(),
            None => detect_pre(&tj["pre_tokenizer"])?,
        };
        let special_id = |key: &str| -> Option<u32> {
            let v = &tc[key];
            let content = v.as_str().or(v["content"].as_str());
            if let Some(c) = content {
                if let Some((&id, _)) = by_id.iter().filter(|(_, t)| *t == c).min_by_key(|p| p.0) {
                    return Some(id as u32);
                }
            }
            let alt = &self.cfg[format!("{key}_id")];
            alt.as_u64()
                .or(alt.as_array().and_then(|a| a.first()?.as_u64()))
                .map(|v| v as u32)
        };
        let mut meta: Vec<(String, Value)> = vec![
            ("tokenizer.ggml.model".into(), "gpt2".into()),
            ("tokenizer.ggml.pre".into(), pre.into()),
            (
                "tokenizer.ggml.tokens".into(),
                Value::Array(Array::String(tokens)),
            ),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(Array::I32(token_type)),
            ),
            (
                "tokenizer.ggml.merges".into(),
                Value::Array(Array::String(merges)),
            ),
        ];
        for (key, gkey) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            if let Some(id) = special_id(key) {
                meta.push((gkey.into(), Value::U32(id)));
            }
        }
        meta.push((
            "tokenizer.ggml.add_bos_token".into(),
            Value::Bool(tc["add_bos_token"].as_bool().unwrap_or(false)),
        ));
        meta.push((
            "tokenizer.ggml.add_eos_token".into(),
            Value::Bool(tc["add_eos_token"].as_bool().unwrap_or(false)),
        ));
        let jinja = self.dir.join("chat_template.jinja");
        let template = match tc["chat_template"].as_str() {
            Some(t) => Some(t.to_string()),
            None if jinja.is_file() => Some(
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("cannot read {}", jinja.display()))?,
            ),
            None => None,
        };
        if let Some(t) = template {
            meta.push(("tokenizer.chat_template".into(), t.into()));
        }
        Ok(meta)
    }
}

/// `tokenizer.ggml.pre` for a tokenizer.json pre-tokenizer: plain byte-level (`gpt-2`) or
/// digits split then byte-level (`smollm`); anything else needs `--pre`.
fn detect_pre(pt: &Json) -> Result<String> {
    let is_byte_level = |p: &Json| p["type"] == "ByteLevel";
    if is_byte_level(pt) && pt["use_regex"].as_bool().unwrap_or(true) {
        return Ok("gpt-2".into());
    }
    if pt["type"] == "Sequence" {
        let items: Vec<&Json> = pt["pretokenizers"]
            .as_array()
            .into_iter()
            .flatten()
            .collect();
        if items.len() == 2
            && items[0]["type"] == "Digits"
            && items[0]["individual_digits"] == true
            && is_byte_level(items[1])
        {
            return Ok("smollm".into());
        }
    }
    bail!(
        "tokenizer.json: pre-tokenizer {} not recognised; name it with --pre (gpt-2, smollm, llama-bpe, qwen2)",
        pt["type"]
    )
}
