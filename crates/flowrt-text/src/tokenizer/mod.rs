//! Text <-> token ids, for a GGUF vocabulary or a Hugging Face tokenizer.json.

pub(crate) mod build;
mod shared;
mod spm;
mod stream;
mod wordpiece;

pub use build::supported_pre_tokenizers;
pub use stream::TokenStreamDecoder;

use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use crate::vocab::{token_type, GgufVocab};
use crate::TextError;

/// Text of control tokens that end a generation when the vocab marks them as control tokens,
/// besides the ids the file names (eos, eot, eom).
const EOG_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end|>",
    "<|end_of_text|>",
    "<EOT>",
    "<|return|>",
    "<|call|>",
];

/// In a harmony vocabulary (gpt-oss: it has `<|return|>` and `<|call|>`) `<|end|>` ends a
/// message, not the turn (the turn goes on with the answer after the reasoning), so it is not
/// an end-of-generation token even where the file names it.
const HARMONY_TURN_ENDS: [&str; 2] = ["<|return|>", "<|call|>"];
const HARMONY_MESSAGE_END: &str = "<|end|>";

/// Which kind of vocab this is (`tokenizer.ggml.model`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE (`gpt2`).
    ByteLevelBpe,
    /// SentencePiece BPE (`llama`), or a `tokenizer.json` BPE that is not byte-level.
    SentencePieceBpe,
    /// A `tokenizer.json` Unigram model (SentencePiece unigram, e.g. T5-style vocabs).
    SentencePieceUnigram,
    /// WordPiece (BERT): a `tokenizer.json` WordPiece model, or a GGUF `bert` vocabulary.
    WordPiece,
}

/// The `tokenizers` pipeline behind a [`Tokenizer`]: built here from GGUF metadata, or read
/// from a Hugging Face `tokenizer.json`.
#[derive(Clone)]
pub(crate) enum Engine {
    Gguf(Box<build::Pipeline>),
    Hf(Box<tokenizers::Tokenizer>),
}

impl Engine {
    fn set_encode_special_tokens(&mut self, value: bool) {
        match self {
            Engine::Gguf(p) => p.set_encode_special_tokens(value),
            Engine::Hf(t) => t.set_encode_special_tokens(value),
        }
    }

    /// Ids of `text`; `post_process` runs the pipeline's post-processor (BOS/EOS templates).
    fn encode(&self, text: &str, post_process: bool) -> Result<Vec<u32>, TextError> {
        let enc = match self {
            Engine::Gguf(p) => p.encode(text, post_process),
            Engine::Hf(t) => t.encode(text, post_process),
        }
        .map_err(|e| TextError::tokenizers("encode", e))?;
        Ok(enc.get_ids().to_vec())
    }

    fn pre_tokenize(&self, pre: &mut PreTokenizedString) -> tokenizers::Result<()> {
        match self {
            Engine::Gguf(p) => match p.get_pre_tokenizer() {
                Some(pt) => pt.pre_tokenize(pre),
                None => Ok(()),
            },
            Engine::Hf(t) => match t.get_pre_tokenizer() {
                Some(pt) => pt.pre_tokenize(pre),
                None => Ok(()),
            },
        }
    }
}

/// How `encode(.., add_special = true, ..)` adds special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddSpecial {
    /// BOS in front when `add_bos`, EOS at the end when `add_eos`.
    Flags { add_bos: bool, add_eos: bool },
    /// Whatever the `tokenizer.json` post-processor adds.
    PostProcessor,
}

/// Everything a [`Tokenizer`] is made of, whichever format it came from.
pub(crate) struct Parts<'a> {
    pub kind: VocabKind,
    pub engine: Engine,
    /// Token text by id; `""` for an id with no token.
    pub tokens: &'a [String],
    /// One [`token_type`] per id.
    pub types: Vec<i32>,
    /// Each token's bytes in decoded text.
    pub pieces: Vec<Vec<u8>>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub add_special: AddSpecial,
    pub strip_leading_space: bool,
    /// End-of-generation ids besides eos/eot/eom and the [`EOG_TEXTS`] control tokens.
    pub extra_eog: Vec<u32>,
}

/// A tokenizer built from a [`GgufVocab`] or a Hugging Face tokenizer directory
/// ([`crate::hf::load_dir`]). Immutable and `Send + Sync`: share it behind an `Arc`.
pub struct Tokenizer {
    kind: VocabKind,
    /// Special tokens matched whole in text.
    parse_special: Engine,
    /// The same, with special tokens taken as plain text (user-defined ones still match).
    plain: Engine,
    /// All tokens' text, back to back; token `i` is `token_text[token_ends[i-1]..token_ends[i]]`
    /// (`""` for an id with no token). One allocation, not one per token.
    token_text: String,
    token_ends: Vec<usize>,
    /// Ids of the tokens with text, sorted by text and then id ([`Tokenizer::token_to_id`]
    /// is a binary search; 4 bytes a token instead of a hash map of owned strings).
    ids_by_text: Vec<u32>,
    types: Vec<i32>,
    /// All tokens' decoded bytes, back to back; token `i` is `piece_bytes[piece_ends[i-1]..piece_ends[i]]`.
    piece_bytes: Vec<u8>,
    piece_ends: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    add_special: AddSpecial,
    /// Decoding drops one leading space (the one the SentencePiece prefix added).
    strip_leading_space: bool,
    eog: Vec<u32>,
    /// Finds special tokens' text (leftmost-longest), built on first use.
    special_matcher: std::sync::OnceLock<Result<aho_corasick::AhoCorasick, String>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Build the tokenizer a GGUF vocabulary describes. Errors name the metadata key at fault
    /// (an unknown `tokenizer.ggml.pre` is an error, never a silent default).
    pub fn from_vocab(v: &GgufVocab) -> Result<Self, TextError> {
        if v.model == "bert" {
            return wordpiece::from_bert_vocab(v);
        }
        let built = build::build(v)?;
        let kind = if v.model == "gpt2" {
            VocabKind::ByteLevelBpe
        } else {
            VocabKind::SentencePieceBpe
        };
        Ok(Self::from_parts(Parts {
            kind,
            engine: Engine::Gguf(Box::new(built.pipeline)),
            tokens: &v.tokens,
            types: (0..v.tokens.len()).map(|i| v.token_type(i)).collect(),
            pieces: built.pieces,
            bos: v.bos,
            eos: v.eos,
            eot: v.eot,
            eom: v.eom,
            add_special: AddSpecial::Flags {
                add_bos: v.add_bos.unwrap_or(kind == VocabKind::SentencePieceBpe),
                add_eos: v.add_eos.unwrap_or(false),
            },
            strip_leading_space: kind == VocabKind::SentencePieceBpe
                && v.add_space_prefix.unwrap_or(true),
            extra_eog: Vec::new(),
        }))
    }

    pub(crate) fn from_parts(p: Parts) -> Self {
        let mut plain = p.engine.clone();
        plain.set_encode_special_tokens(true);
        let mut token_text = String::with_capacity(p.tokens.iter().map(String::len).sum());
        let mut token_ends = Vec::with_capacity(p.tokens.len());
        for t in p.tokens {
            token_text.push_str(t);
            token_ends.push(token_text.len());
        }
        let mut ids_by_text: Vec<u32> = (0..p.tokens.len() as u32)
            .filter(|&id| !p.tokens[id as usize].is_empty())
            .collect();
        // Stable: a text the vocab repeats keeps its ids in order, the first one first.
        ids_by_text.sort_by(|&a, &b| p.tokens[a as usize].cmp(&p.tokens[b as usize]));
        let mut piece_bytes = Vec::new();
        let mut piece_ends = Vec::with_capacity(p.pieces.len());
        for piece in &p.pieces {
            piece_bytes.extend_from_slice(piece);
            piece_ends.push(piece_bytes.len());
        }

        let mut tokenizer = Self {
            kind: p.kind,
            parse_special: p.engine,
            plain,
            token_text,
            token_ends,
            ids_by_text,
            types: p.types,
            piece_bytes,
            piece_ends,
            bos: p.bos,
            eos: p.eos,
            eot: p.eot,
            eom: p.eom,
            add_special: p.add_special,
            strip_leading_space: p.strip_leading_space,
            eog: Vec::new(),
            special_matcher: std::sync::OnceLock::new(),
        };

        let mut eog: Vec<u32> = [p.eos, p.eot, p.eom].into_iter().flatten().collect();
        eog.extend(&p.extra_eog);
        for text in EOG_TEXTS {
            if let Some(id) = tokenizer.token_to_id(text) {
                if tokenizer.types[id as usize] == token_type::CONTROL {
                    eog.push(id);
                }
            }
        }
        let harmony = HARMONY_TURN_ENDS
            .iter()
            .all(|t| tokenizer.token_to_id(t).is_some_and(|id| eog.contains(&id)));
        if harmony {
            if let Some(end) = tokenizer.token_to_id(HARMONY_MESSAGE_END) {
                eog.retain(|&id| id != end);
            }
        }
        eog.sort_unstable();
        eog.dedup();
        tokenizer.eog = eog;
        tokenizer
    }

    /// Text to ids.
    ///
    /// `add_special`: add what the tokenizer's source asks for -- for a GGUF, BOS in front
    /// (and EOS at the end) per `tokenizer.ggml.add_bos_token` / `add_eos_token`; for a HF
    /// directory, see [`crate::hf`] (like HF's `tokenizer(text)`).
    /// `parse_special`: match special tokens (control and unknown, such as `<|im_start|>`)
    /// written in the text as single ids; when false they are tokenized as plain text.
    /// User-defined tokens always match.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TextError> {
        let pipeline = if parse_special {
            &self.parse_special
        } else {
            &self.plain
        };
        match (add_special, self.add_special) {
            (true, AddSpecial::PostProcessor) => pipeline.encode(text, true),
            (true, AddSpecial::Flags { add_bos, add_eos }) => {
                let body = pipeline.encode(text, false)?;
                let mut ids = Vec::with_capacity(body.len() + 2);
                if add_bos {
                    ids.extend(self.bos);
                }
                ids.extend_from_slice(&body);
                if add_eos {
                    ids.extend(self.eos);
                }
                Ok(ids)
            }
            (false, _) => pipeline.encode(text, false),
        }
    }

    /// Ids to text. Invalid UTF-8 (a character cut between ids) becomes U+FFFD. With
    /// `skip_special`, special tokens (control and unknown) are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        let mut stream = TokenStreamDecoder::new(skip_special);
        let mut out = String::new();
        for &id in ids {
            out.push_str(stream.push(self, id)?);
        }
        out.push_str(stream.finish());
        Ok(out)
    }

    /// A streaming decoder for generated ids (see [`TokenStreamDecoder`]).
    pub fn stream_decoder(&self, skip_special: bool) -> TokenStreamDecoder {
        TokenStreamDecoder::new(skip_special)
    }

    /// The bytes token `id` stands for in decoded text (a byte-fallback token is one byte,
    /// possibly half a character).
    pub fn token_to_piece(&self, id: u32) -> Result<&[u8], TextError> {
        let i = self.check_id(id)?;
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        Ok(&self.piece_bytes[start..self.piece_ends[i]])
    }

    /// The token as the vocab spells it (`Ġthe`, `▁the`, `<|im_end|>`); `None` outside the
    /// vocabulary and for an id inside it that has no token (a gap in a HF vocab).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        let i = self.check_id(id).ok()?;
        Some(self.token_text_of(i)).filter(|t| !t.is_empty())
    }

    /// The id of a token as the vocab spells it (first one if the vocab repeats it).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        let first = self
            .ids_by_text
            .partition_point(|&id| self.token_text_of(id as usize) < token);
        let &id = self.ids_by_text.get(first)?;
        (self.token_text_of(id as usize) == token).then_some(id)
    }

    /// Text of token `i` (in range), `""` for an id with no token.
    fn token_text_of(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.token_ends[i - 1] };
        &self.token_text[start..self.token_ends[i]]
    }

    /// Whether `id` is a special token: control or unknown (what `skip_special` drops and
    /// `parse_special` matches).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.types.get(id as usize),
            Some(&token_type::CONTROL) | Some(&token_type::UNKNOWN)
        )
    }

    /// A matcher for the text of every special token (what `parse_special` would match).
    pub(crate) fn special_matcher(&self) -> Result<&aho_corasick::AhoCorasick, TextError> {
        let built = self.special_matcher.get_or_init(|| {
            let texts: Vec<&str> = (0..self.vocab_size())
                .filter(|&i| self.is_special(i as u32))
                .map(|i| self.token_text_of(i))
                .filter(|t| !t.is_empty())
                .collect();
            aho_corasick::AhoCorasick::builder()
                .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                .build(texts)
                .map_err(|e| e.to_string())
        });
        built.as_ref().map_err(|e| TextError::Tokenizers {
            context: "special-token matcher",
            message: e.clone(),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.token_ends.len()
    }

    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Whether `encode(.., add_special = true, ..)` puts BOS in front.
    pub fn adds_bos(&self) -> bool {
        let Some(bos) = self.bos else {
            return false;
        };
        match self.add_special {
            AddSpecial::Flags { add_bos, .. } => add_bos,
            // Whatever the post-processor does, it does to any text.
            AddSpecial::PostProcessor => self
                .parse_special
                .encode("a", true)
                .is_ok_and(|ids| ids.first() == Some(&bos)),
        }
    }

    /// Ids that end a generation: eos, eot, eom and the control tokens in [`EOG_TEXTS`]
    /// (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, `<|endoftext|>`, ...), sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The pieces the pre-tokenizer cuts `text` into, in vocab spelling, before BPE and
    /// without added-token matching. For checking a pre-tokenizer against a reference.
    pub fn pre_tokenize(&self, text: &str) -> Result<Vec<String>, TextError> {
        let mut pre = PreTokenizedString::from(text);
        self.plain
            .pre_tokenize(&mut pre)
            .map_err(|e| TextError::tokenizers("pre-tokenize", e))?;
        Ok(pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect())
    }

    pub(crate) fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    fn check_id(&self, id: u32) -> Result<usize, TextError> {
        let i = id as usize;
        if i < self.vocab_size() {
            Ok(i)
        } else {
            Err(TextError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })
        }
    }
}
