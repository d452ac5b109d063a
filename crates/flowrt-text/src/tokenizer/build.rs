//! Building a `tokenizers` BPE pipeline from a [`GgufVocab`].
//!
//! Two vocab kinds, as llama.cpp names them in `tokenizer.ggml.model`:
//!
//! - `gpt2`: byte-level BPE. Tokens are spelled in the GPT-2 byte alphabet, merges come from
//!   the file, and `tokenizer.ggml.pre` names the pre-tokenizer ([`GPT2_PRE_TOKENIZERS`]).
//! - `llama`: SentencePiece BPE ([`SpmBpe`]). Tokens use `▁` for spaces, a pair merges with
//!   the score of the token it makes (ties: leftmost first), characters missing from the vocab
//!   fall back to `<0xNN>` byte tokens, and a `▁` is put in front of the text
//!   (`add_space_prefix`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BpeTrainer, Merges, Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizedString,
    PreTokenizer, PreTokenizerWrapper, SplitDelimiterBehavior, Token, TokenizerImpl,
};

use super::shared::SharedModel;
use super::spm::SpmBpe;
use crate::vocab::{token_type, GgufVocab};
use crate::TextError;

/// The `tokenizers` pipeline this crate runs: our own pre-tokenizer type so that the
/// SentencePiece space handling can be expressed exactly; no normalizer, post-processor or
/// decoder (BOS/EOS and decoding are done by [`super::Tokenizer`] itself).
pub(crate) type Pipeline = TokenizerImpl<
    SharedModel<GgufModel>,
    NormalizerWrapper,
    PreTok,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// The model of a GGUF vocab: `tokenizers`' BPE for `gpt2` (ranked merges, ties leftmost),
/// [`SpmBpe`] for `llama` (scores, ties leftmost).
#[derive(Debug)]
pub(crate) enum GgufModel {
    Bpe(Box<BPE>),
    Spm(SpmBpe),
}

impl Model for GgufModel {
    /// Unused: these models are built from a vocabulary, never trained.
    type Trainer = BpeTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match self {
            GgufModel::Bpe(m) => m.tokenize(sequence),
            GgufModel::Spm(m) => m.tokenize(sequence),
        }
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            GgufModel::Bpe(m) => m.token_to_id(token),
            GgufModel::Spm(m) => m.token_to_id(token),
        }
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            GgufModel::Bpe(m) => m.id_to_token(id),
            GgufModel::Spm(m) => m.id_to_token(id),
        }
    }
    fn get_vocab(&self) -> HashMap<String, u32> {
        match self {
            GgufModel::Bpe(m) => m.get_vocab(),
            GgufModel::Spm(m) => m.get_vocab(),
        }
    }
    fn get_vocab_size(&self) -> usize {
        match self {
            GgufModel::Bpe(m) => m.get_vocab_size(),
            GgufModel::Spm(m) => m.get_vocab_size(),
        }
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        match self {
            GgufModel::Bpe(m) => m.save(folder, prefix),
            GgufModel::Spm(m) => m.save(folder, prefix),
        }
    }
    fn get_trainer(&self) -> BpeTrainer {
        BpeTrainer::default()
    }
}

/// Llama 3's split regex (from its tokenizer.json).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split regex (from its tokenizer.json): like Llama 3 but one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a `gpt2` vocab splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gpt2Split {
    /// GPT-2's own regex inside ByteLevel.
    ByteLevelRegex,
    /// Every digit on its own, then GPT-2's regex (SmolLM2's tokenizer.json).
    DigitsThenByteLevel,
    /// A split regex, then byte-level mapping without further splitting.
    Regex(&'static str),
}

/// `tokenizer.ggml.pre` values this crate knows, and what each means. Data, not code: adding a
/// family is one row (and a golden test).
const GPT2_PRE_TOKENIZERS: &[(&str, Gpt2Split)] = &[
    ("default", Gpt2Split::ByteLevelRegex),
    ("gpt2", Gpt2Split::ByteLevelRegex),
    // llama.cpp's converter writes this name for the GPT-2 split.
    ("gpt-2", Gpt2Split::ByteLevelRegex),
    ("smollm", Gpt2Split::DigitsThenByteLevel),
    ("llama-bpe", Gpt2Split::Regex(LLAMA3_SPLIT)),
    ("llama3", Gpt2Split::Regex(LLAMA3_SPLIT)),
    ("llama-v3", Gpt2Split::Regex(LLAMA3_SPLIT)),
    ("qwen2", Gpt2Split::Regex(QWEN2_SPLIT)),
];

/// The names accepted in `tokenizer.ggml.pre`.
pub fn supported_pre_tokenizers() -> Vec<&'static str> {
    GPT2_PRE_TOKENIZERS.iter().map(|(name, _)| *name).collect()
}

/// Our pre-tokenizer: one of HF's, or SentencePiece's space handling.
#[derive(Clone)]
pub(crate) enum PreTok {
    Hf(PreTokenizerWrapper),
    /// Spaces become `▁`; with `add_prefix`, a `▁` goes in front of the stretch of text that
    /// starts the input (not after an added token), even when that text already starts with a
    /// space -- as SentencePiece's dummy prefix does.
    SentencePiece {
        add_prefix: bool,
    },
}

impl PreTokenizer for PreTok {
    fn pre_tokenize(&self, pretokenized: &mut PreTokenizedString) -> tokenizers::Result<()> {
        match self {
            PreTok::Hf(p) => p.pre_tokenize(pretokenized),
            PreTok::SentencePiece { add_prefix } => pretokenized.split(|_, mut normalized| {
                normalized.replace(' ', "▁")?;
                if *add_prefix && !normalized.is_empty() && normalized.offsets_original().0 == 0 {
                    normalized.prepend("▁");
                }
                Ok(vec![normalized])
            }),
        }
    }
}

/// What [`build`] produces besides the pipeline.
pub(crate) struct Built {
    pub pipeline: Pipeline,
    /// Each token's bytes as it appears in decoded text.
    pub pieces: Vec<Vec<u8>>,
}

pub(crate) fn build(v: &GgufVocab) -> Result<Built, TextError> {
    v.validate()?;
    match v.model.as_str() {
        "gpt2" => build_gpt2(v),
        "llama" => build_llama(v),
        other => Err(TextError::UnsupportedModel {
            model: other.to_string(),
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// gpt2: byte-level BPE
// ---------------------------------------------------------------------------------------------

/// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes
/// are moved to U+0100.. in byte order.
pub(crate) fn byte_alphabet() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        table[b as usize] = char::from_u32(c).expect("alphabet is in the BMP");
    }
    table
}

fn build_gpt2(v: &GgufVocab) -> Result<Built, TextError> {
    let pre_name = v.pre.as_deref().unwrap_or("default");
    let split = GPT2_PRE_TOKENIZERS
        .iter()
        .find(|(name, _)| *name == pre_name)
        .map(|(_, s)| *s)
        .ok_or_else(|| TextError::UnsupportedPreTokenizer {
            pre: pre_name.to_string(),
            supported: supported_pre_tokenizers().join(", "),
        })?;
    let merges_src = v.merges.as_ref().ok_or(TextError::MissingKey {
        key: "tokenizer.ggml.merges",
        why: "a gpt2 (byte-level BPE) vocab needs its merges",
    })?;

    let alphabet = byte_alphabet();
    let mut inverse: HashMap<char, u8> = HashMap::with_capacity(256);
    for (b, c) in alphabet.iter().enumerate() {
        inverse.insert(*c, b as u8);
    }

    // A token written in the byte alphabet is looked up as it is; any other token (a
    // user-defined one stored as raw text) is respelled in the alphabet so BPE can reach it.
    let mut vocab = Vocab::default();
    let mut pieces = Vec::with_capacity(v.tokens.len());
    let mut in_alphabet = Vec::with_capacity(v.tokens.len());
    for (id, tok) in v.tokens.iter().enumerate() {
        let bytes: Option<Vec<u8>> = tok.chars().map(|c| inverse.get(&c).copied()).collect();
        let (spelling, piece) = match bytes {
            Some(bytes) => (tok.clone(), bytes),
            None => (
                tok.bytes()
                    .map(|b| alphabet[b as usize])
                    .collect::<String>(),
                tok.as_bytes().to_vec(),
            ),
        };
        in_alphabet.push(spelling == *tok);
        vocab.entry(spelling).or_insert(id as u32);
        pieces.push(piece);
    }

    let mut merges: Merges = Vec::with_capacity(merges_src.len());
    for (index, m) in merges_src.iter().enumerate() {
        let (l, r) = m
            .split_once(' ')
            .filter(|(l, r)| !l.is_empty() && !r.is_empty() && !r.contains(' '))
            .ok_or_else(|| TextError::BadMerge {
                index,
                merge: m.clone(),
            })?;
        merges.push((l.to_string(), r.to_string()));
    }

    // No unk token: like SmolLM2's tokenizer.json, bytes missing from the alphabet are dropped.
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| TextError::tokenizers("BPE from GGUF vocab and merges", e))?;

    let byte_level = ByteLevel::new(false, true, true);
    let pre: PreTokenizerWrapper = match split {
        Gpt2Split::ByteLevelRegex => byte_level.into(),
        Gpt2Split::DigitsThenByteLevel => {
            Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
        }
        Gpt2Split::Regex(re) => {
            let split = Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TextError::tokenizers("split regex", e))?;
            Sequence::new(vec![split.into(), byte_level.use_regex(false).into()]).into()
        }
    };

    let mut pipeline = Pipeline::new(SharedModel::new(GgufModel::Bpe(Box::new(bpe))));
    pipeline.with_pre_tokenizer(Some(PreTok::Hf(pre)));
    // A control token spelled outside the byte alphabet is a mislabelled ordinary token (HF
    // skips these too); user-defined ones outside it are reached through their respelling.
    add_tokens(&mut pipeline, v, |id| in_alphabet[id]);
    Ok(Built { pipeline, pieces })
}

// ---------------------------------------------------------------------------------------------
// llama: SentencePiece BPE
// ---------------------------------------------------------------------------------------------

fn build_llama(v: &GgufVocab) -> Result<Built, TextError> {
    let scores = v.scores.as_ref().ok_or(TextError::MissingKey {
        key: "tokenizer.ggml.scores",
        why: "a llama (SentencePiece) vocab needs scores to order its merges",
    })?;

    let mut pipeline = Pipeline::new(SharedModel::new(GgufModel::Spm(SpmBpe::new(v, scores))));
    pipeline.with_pre_tokenizer(Some(PreTok::SentencePiece {
        add_prefix: v.add_space_prefix.unwrap_or(true),
    }));
    add_tokens(&mut pipeline, v, |_| true);

    let pieces = v
        .tokens
        .iter()
        .enumerate()
        .map(|(id, tok)| match byte_token(tok) {
            Some(b) if v.token_type(id) == token_type::BYTE => vec![b],
            _ => tok.replace('▁', " ").into_bytes(),
        })
        .collect();
    Ok(Built { pipeline, pieces })
}

/// `<0xNN>` -> NN.
pub(crate) fn byte_token(tok: &str) -> Option<u8> {
    let hex = tok.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

// ---------------------------------------------------------------------------------------------
// Added tokens
// ---------------------------------------------------------------------------------------------

/// Control and unknown tokens (`<s>`, `<|im_end|>`, `<unk>`) become special added tokens
/// (matched whole only when special tokens are parsed, as HF and llama.cpp do); user-defined
/// tokens become ordinary added tokens (always matched whole).
fn add_tokens(pipeline: &mut Pipeline, v: &GgufVocab, eligible: impl Fn(usize) -> bool) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (id, tok) in v.tokens.iter().enumerate() {
        if tok.is_empty() || !eligible(id) {
            continue;
        }
        match v.token_type(id) {
            token_type::CONTROL | token_type::UNKNOWN => {
                special.push(AddedToken::from(tok.clone(), true).normalized(false))
            }
            token_type::USER_DEFINED => {
                user.push(AddedToken::from(tok.clone(), false).normalized(false))
            }
            _ => {}
        }
    }
    pipeline.add_special_tokens(&special);
    pipeline.add_tokens(&user);
}
