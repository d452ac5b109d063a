//! The tensors of a Hugging Face checkpoint directory: `model.safetensors`, or the shards that
//! `model.safetensors.index.json` lists. Files are memory-mapped; the `safetensors` crate checks
//! each header (offsets inside the file, sizes matching shapes) before any tensor is used.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrt_dtype::GgmlType;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::ModelError;

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
pub struct StEntry {
    /// Index into [`SafetensorsDir::maps`].
    pub shard: usize,
    /// The element type, or the safetensors name of a type flowrt cannot use.
    pub dtype: Result<GgmlType, String>,
    /// Shape as stored (row-major, last dimension contiguous).
    pub shape: Vec<usize>,
    /// Byte range in the shard.
    pub start: usize,
    pub end: usize,
}

/// Every tensor of a checkpoint directory, by name.
#[derive(Debug)]
pub struct SafetensorsDir {
    pub dir: PathBuf,
    pub maps: Vec<Arc<Mmap>>,
    pub tensors: HashMap<String, StEntry>,
}

/// Most shards an index may name (no published model comes near).
const MAX_SHARDS: usize = 4096;

impl SafetensorsDir {
    /// Open the weights of the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<SafetensorsDir, ModelError> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let shard_names: Vec<String> = if single.is_file() {
            vec!["model.safetensors".into()]
        } else if index.is_file() {
            shards_from_index(&index)?
        } else {
            return Err(ModelError::BadCheckpoint {
                path: dir.to_path_buf(),
                reason: "no model.safetensors or model.safetensors.index.json".into(),
            });
        };
        let mut maps = Vec::with_capacity(shard_names.len());
        let mut tensors = HashMap::new();
        for (shard, name) in shard_names.iter().enumerate() {
            let path = dir.join(name);
            let bad = |reason: String| ModelError::BadCheckpoint {
                path: path.clone(),
                reason,
            };
            let file = File::open(&path).map_err(|e| bad(e.to_string()))?;
            // SAFETY: the map is read-only and private to this value, and every slice handed
            // out borrows it (through an `Arc`). Mapping is unsound only if another process
            // changes or truncates the file meanwhile; model files are treated as immutable,
            // as for GGUF files.
            #[allow(unsafe_code)]
            let map = unsafe { Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
            let st = SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
            let base = map.as_ptr() as usize;
            for (tname, view) in st.tensors() {
                let data = view.data();
                let start = data.as_ptr() as usize - base;
                let entry = StEntry {
                    shard,
                    dtype: match view.dtype() {
                        Dtype::F32 => Ok(GgmlType::F32),
                        Dtype::F16 => Ok(GgmlType::F16),
                        Dtype::BF16 => Ok(GgmlType::BF16),
                        other => Err(format!("{other:?}")),
                    },
                    shape: view.shape().to_vec(),
                    start,
                    end: start + data.len(),
                };
                if tensors.insert(tname.clone(), entry).is_some() {
                    return Err(bad(format!(
                        "tensor `{tname}` appears in more than one shard"
                    )));
                }
            }
            drop(st);
            maps.push(Arc::new(map));
        }
        Ok(SafetensorsDir {
            dir: dir.to_path_buf(),
            maps,
            tensors,
        })
    }

    /// The bytes of a tensor.
    pub fn bytes(&self, e: &StEntry) -> &[u8] {
        &self.maps[e.shard][e.start..e.end]
    }

    /// Drops the resident pages of `data` (a slice [`SafetensorsDir::bytes`] gave) from this
    /// process, so a reader that streams through the weights once (e.g. `flowrt pack`) does
    /// not end with the whole checkpoint in its resident set. Later reads fault the pages back
    /// in from the file. A slice from elsewhere is ignored.
    pub fn release(&self, data: &[u8]) {
        const PAGE: usize = 4096;
        let addr = data.as_ptr() as usize;
        for map in &self.maps {
            let base = map.as_ptr() as usize;
            if addr < base || addr + data.len() > base + map.len() {
                continue;
            }
            let start = (addr - base).next_multiple_of(PAGE);
            let end = (addr - base + data.len()) / PAGE * PAGE;
            if end > start {
                // SAFETY: the map is read-only and backed by the file, so dropping its pages
                // loses nothing: later reads fault the unchanged contents back in. (The
                // hazard this call is `unsafe` for is discarding private modified pages, which
                // a read-only map has none of.) A failure only leaves the pages resident.
                #[allow(unsafe_code)]
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
            return;
        }
    }

    /// Where the text decoder's tensors sit: (prefix of the decoder's names, prefix of the
    /// output projection's). Text decoders are under `model.`; multimodal wrappers nest them
    /// (`model.language_model.`, or `language_model.model.` with the head under
    /// `language_model.`); a base model saved on its own (sentence-transformers' decoder
    /// embedders, e.g. Qwen3-Embedding) has no prefix.
    pub fn decoder_prefixes(&self) -> (&'static str, &'static str) {
        const LAYOUTS: [(&str, &str); 4] = [
            ("model.", ""),
            ("model.language_model.", ""),
            ("language_model.model.", "language_model."),
            ("", ""),
        ];
        LAYOUTS
            .iter()
            .find(|(p, _)| {
                self.tensors
                    .contains_key(&format!("{p}embed_tokens.weight"))
            })
            .copied()
            .unwrap_or(LAYOUTS[0])
    }
}

/// The distinct shard file names an index lists, in first-seen order. Names must be plain file
/// names in the same directory.
fn shards_from_index(index: &Path) -> Result<Vec<String>, ModelError> {
    let bad = |reason: String| ModelError::BadCheckpoint {
        path: index.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(index).map_err(|e| bad(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut names: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("`weight_map.{tensor}` is not a file name")))?;
        let plain = Path::new(file).file_name().and_then(|f| f.to_str()) == Some(file);
        if !plain || file == ".." || file == "." {
            return Err(bad(format!(
                "shard `{file}` is not a plain file name in the checkpoint directory"
            )));
        }
        if !names.iter().any(|n| n == file) {
            names.push(file.to_string());
        }
        if names.len() > MAX_SHARDS {
            return Err(bad(format!("more than {MAX_SHARDS} shards")));
        }
    }
    if names.is_empty() {
        return Err(bad("`weight_map` lists no tensors".into()));
    }
    Ok(names)
}
