//! [`SharedModel`]: one `tokenizers` model behind an `Arc`, so that several pipelines over the
//! same vocabulary (with and without special-token matching) hold it once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::{Model, Token};

/// A `tokenizers` model shared by the pipelines that clone it. A BPE model of a 49k-token
/// vocab (vocab, reverse vocab, merges) is several MiB; cloning a pipeline then copies only
/// the pointer. Every call goes to the inner model, whose cache is already behind a lock.
#[derive(Debug)]
pub(crate) struct SharedModel<M>(Arc<M>);

impl<M> SharedModel<M> {
    pub fn new(model: M) -> Self {
        SharedModel(Arc::new(model))
    }
}

impl<M> Clone for SharedModel<M> {
    fn clone(&self) -> Self {
        SharedModel(Arc::clone(&self.0))
    }
}

impl<M: Model> Model for SharedModel<M> {
    type Trainer = M::Trainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.tokenize(sequence)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }
    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_vocab()
    }
    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }
    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }
    fn get_trainer(&self) -> Self::Trainer {
        self.0.get_trainer()
    }
}
