//! SentencePiece BPE, run the way SentencePiece's own encoder (`bpe_model.cc`) and llama.cpp's
//! `llm_tokenizer_spm` run it, for GGUF `llama` vocabularies (tokens and scores, no merges).
//!
//! The text starts as single characters. The adjacent pair whose concatenation is the piece
//! with the highest score is merged, over and over; among pairs with equal scores the leftmost
//! goes first (both implementations order pairs by
//! `l.score < r.score || (l.score == r.score && l.left > r.left)`). A character that ends up in
//! no piece becomes its UTF-8 bytes as `<0xNN>` tokens, else the unknown token (consecutive
//! unknown characters fused into one), else nothing.
//!
//! Why not a `tokenizers` BPE with merges derived from the scores, as transformers builds for a
//! GGUF: a BPE model ranks every pair on its own, so pairs whose pieces have equal scores get a
//! fixed order (transformers: longer left part, longer right part, then token order) where
//! SentencePiece goes by position. On such ties the two tokenise differently -- with pieces
//! "bc" and "ab" of equal score, SentencePiece cuts "abc" as "ab" "c", the derived BPE as
//! "a" "bc" -- and the model was trained on SentencePiece's cut
//! (tests/fixtures/text/spm_ties.json).
//!
//! Pieces BPE may form are SentencePiece's: normal, user-defined and unused tokens; control,
//! unknown and byte tokens only come from special-token matching and byte fallback. (llama.cpp
//! looks every token up, so it could also form a control token from text that spells it when
//! special tokens are not parsed; SentencePiece re-splits a formed unused piece, llama.cpp keeps
//! it, as this does.)

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::BpeTrainer;
use tokenizers::{Model, Token};

use crate::vocab::{token_type, GgufVocab};

/// A piece BPE may form.
#[derive(Debug, Clone, Copy)]
struct Piece {
    id: u32,
    score: f32,
}

/// The SentencePiece BPE model of a GGUF `llama` vocabulary.
#[derive(Debug)]
pub(crate) struct SpmBpe {
    /// Pieces BPE may form, by text (the first id of a text the vocab repeats).
    pieces: HashMap<String, Piece>,
    /// Bytes of the longest piece: no longer pair needs looking up.
    max_piece_len: usize,
    /// Every token by text (first id of a repeated text).
    vocab: HashMap<String, u32>,
    /// Token text by id.
    vocab_r: Vec<String>,
    /// The `<0xNN>` token of each byte, where the vocab has one.
    byte_ids: Box<[Option<u32>; 256]>,
    unk: Option<u32>,
}

impl SpmBpe {
    /// `scores` has one score per token (checked by [`GgufVocab::validate`]).
    pub fn new(v: &GgufVocab, scores: &[f32]) -> Self {
        let mut pieces = HashMap::new();
        let mut vocab = HashMap::with_capacity(v.tokens.len());
        for (id, tok) in v.tokens.iter().enumerate() {
            vocab.entry(tok.clone()).or_insert(id as u32);
            let formable = !matches!(
                v.token_type(id),
                token_type::CONTROL | token_type::UNKNOWN | token_type::BYTE
            );
            if formable && !tok.is_empty() {
                pieces.entry(tok.clone()).or_insert(Piece {
                    id: id as u32,
                    score: scores[id],
                });
            }
        }
        let max_piece_len = pieces.keys().map(String::len).max().unwrap_or(0);
        let mut byte_ids = Box::new([None; 256]);
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = vocab.get(&format!("<0x{b:02X}>")).copied();
        }
        SpmBpe {
            pieces,
            max_piece_len,
            vocab,
            vocab_r: v.tokens.clone(),
            byte_ids,
            unk: v.unk,
        }
    }

    /// Queue the merge of adjacent symbols `left` and `right` if their text is a piece.
    fn push_pair(
        &self,
        queue: &mut BinaryHeap<Pair>,
        text: &str,
        syms: &[Symbol],
        left: usize,
        right: usize,
    ) {
        let (start, len) = (syms[left].start, syms[left].len + syms[right].len);
        if len > self.max_piece_len {
            return;
        }
        if let Some(p) = self.pieces.get(&text[start..start + len]) {
            queue.push(Pair {
                score: p.score,
                left,
                right,
                len,
            });
        }
    }
}

/// A run of the text: `len` bytes from `start` (0 once merged into the symbol on its left),
/// in a list linked by index.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbols `left` and `right`, `len` bytes together when queued.
#[derive(Debug, Clone, Copy)]
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    /// The queue pops the greatest: the higher score, and among equal scores the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        let by_score = if self.score == other.score {
            Ordering::Equal // also -0.0 == 0.0, as in C++
        } else {
            self.score.total_cmp(&other.score)
        };
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

impl Model for SpmBpe {
    /// Unused: this model is built from a vocabulary, never trained.
    type Trainer = BpeTrainer;

    fn tokenize(&self, text: &str) -> tokenizers::Result<Vec<Token>> {
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let n = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }

        let mut queue = BinaryHeap::new();
        for i in 1..n {
            self.push_pair(&mut queue, text, &syms, i - 1, i);
        }
        while let Some(pair) = queue.pop() {
            let (l, r) = (pair.left, pair.right);
            // Stale: one side has since been merged into something else.
            if syms[l].len == 0 || syms[r].len == 0 || syms[l].len + syms[r].len != pair.len {
                continue;
            }
            syms[l].len += syms[r].len;
            syms[r].len = 0;
            syms[l].next = syms[r].next;
            if let Some(next) = syms[r].next {
                syms[next].prev = Some(l);
            }
            if let Some(prev) = syms[l].prev {
                self.push_pair(&mut queue, text, &syms, prev, l);
            }
            if let Some(next) = syms[l].next {
                self.push_pair(&mut queue, text, &syms, l, next);
            }
        }

        let mut out = Vec::with_capacity(n);
        // Unknown characters waiting to become one unknown token: their byte range.
        let mut unk_run: Option<(usize, usize)> = None;
        let flush_unk = |out: &mut Vec<Token>, run: &mut Option<(usize, usize)>| {
            if let (Some((start, end)), Some(unk)) = (run.take(), self.unk) {
                out.push(Token::new(
                    unk,
                    self.vocab_r[unk as usize].clone(),
                    (start, end),
                ));
            }
        };
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            let Symbol { start, len, .. } = syms[i];
            let end = start + len;
            let piece = &text[start..end];
            if let Some(p) = self.pieces.get(piece) {
                flush_unk(&mut out, &mut unk_run);
                out.push(Token::new(p.id, piece.to_string(), (start, end)));
            } else if let Some(ids) = piece
                .bytes()
                .map(|b| self.byte_ids[b as usize])
                .collect::<Option<Vec<u32>>>()
            {
                // Never merged, so one character: one token per byte.
                flush_unk(&mut out, &mut unk_run);
                for (k, id) in ids.into_iter().enumerate() {
                    let value = self.vocab_r[id as usize].clone();
                    out.push(Token::new(id, value, (start + k, start + k + 1)));
                }
            } else if self.unk.is_some() {
                unk_run = Some((unk_run.map_or(start, |(s, _)| s), end));
            }
            at = syms[i].next;
        }
        flush_unk(&mut out, &mut unk_run);
        Ok(out)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.get(token).copied()
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.vocab_r.get(id as usize).cloned()
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        self.vocab.clone()
    }

    fn get_vocab_size(&self) -> usize {
        self.vocab_r.len()
    }

    fn save(&self, _folder: &Path, _prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        Err(
            "a SentencePiece BPE built from GGUF metadata cannot be saved as a tokenizers model"
                .into(),
        )
    }

    fn get_trainer(&self) -> BpeTrainer {
        BpeTrainer::default()
    }
}
