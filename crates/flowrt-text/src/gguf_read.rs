//! [`GgufVocab`] from a GGUF file's metadata.

use flowrt_gguf::{Array, GgufFile};

use crate::{GgufVocab, TextError};

pub(crate) fn read_vocab(f: &GgufFile) -> Result<GgufVocab, TextError> {
    let model = f
        .get_str("tokenizer.ggml.model")?
        .ok_or(TextError::MissingKey {
            key: "tokenizer.ggml.model",
            why: "the file has no tokenizer",
        })?
        .to_string();
    let tokens = strings(f, "tokenizer.ggml.tokens")?.ok_or(TextError::MissingKey {
        key: "tokenizer.ggml.tokens",
        why: "the file has no vocabulary",
    })?;
    let v = GgufVocab {
        model,
        pre: f.get_str("tokenizer.ggml.pre")?.map(str::to_string),
        tokens,
        scores: floats(f, "tokenizer.ggml.scores")?,
        token_types: ints(f, "tokenizer.ggml.token_type")?,
        merges: strings(f, "tokenizer.ggml.merges")?,
        bos: id(f, "tokenizer.ggml.bos_token_id")?,
        eos: id(f, "tokenizer.ggml.eos_token_id")?,
        eot: id(f, "tokenizer.ggml.eot_token_id")?,
        eom: id(f, "tokenizer.ggml.eom_token_id")?,
        unk: id(f, "tokenizer.ggml.unknown_token_id")?,
        pad: id(f, "tokenizer.ggml.padding_token_id")?,
        sep: id(f, "tokenizer.ggml.seperator_token_id")?,
        add_sep: f.get_bool("tokenizer.ggml.add_sep_token")?,
        add_bos: f.get_bool("tokenizer.ggml.add_bos_token")?,
        add_eos: f.get_bool("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: f.get_bool("tokenizer.ggml.add_space_prefix")?,
        chat_template: f.get_str("tokenizer.chat_template")?.map(str::to_string),
    };
    v.validate()?;
    Ok(v)
}

fn strings(f: &GgufFile, key: &str) -> Result<Option<Vec<String>>, TextError> {
    Ok(f.get_str_array(key)?
        .map(|v| v.into_iter().map(str::to_string).collect()))
}

fn id(f: &GgufFile, key: &str) -> Result<Option<u32>, TextError> {
    match f.get_u64(key)? {
        None => Ok(None),
        Some(v) => u32::try_from(v).map(Some).map_err(|_| TextError::Metadata {
            key: key.to_string(),
            message: format!("token id {v} does not fit in 32 bits"),
        }),
    }
}

fn ints(f: &GgufFile, key: &str) -> Result<Option<Vec<i32>>, TextError> {
    let Some(a) = f.get_array(key)? else {
        return Ok(None);
    };
    let bad = || TextError::Metadata {
        key: key.to_string(),
        message: format!(
            "expected an array of integers, found an array of {:?}",
            a.elem_type()
        ),
    };
    let conv = |x: i64| i32::try_from(x).map_err(|_| bad());
    Ok(Some(match a {
        Array::I32(v) => v.clone(),
        Array::U8(v) => v.iter().map(|&x| i32::from(x)).collect(),
        Array::I8(v) => v.iter().map(|&x| i32::from(x)).collect(),
        Array::U16(v) => v.iter().map(|&x| i32::from(x)).collect(),
        Array::I16(v) => v.iter().map(|&x| i32::from(x)).collect(),
        Array::U32(v) => v
            .iter()
            .map(|&x| conv(i64::from(x)))
            .collect::<Result<_, _>>()?,
        Array::I64(v) => v.iter().map(|&x| conv(x)).collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    }))
}

fn floats(f: &GgufFile, key: &str) -> Result<Option<Vec<f32>>, TextError> {
    let Some(a) = f.get_array(key)? else {
        return Ok(None);
    };
    Ok(Some(match a {
        Array::F32(v) => v.clone(),
        Array::F64(v) => v.iter().map(|&x| x as f32).collect(),
        _ => {
            return Err(TextError::Metadata {
                key: key.to_string(),
                message: format!(
                    "expected an array of floats, found an array of {:?}",
                    a.elem_type()
                ),
            })
        }
    }))
}
