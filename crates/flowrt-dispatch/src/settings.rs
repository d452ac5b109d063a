//! Settings every backend understands, and the backend-specific ones each parses itself.
//!
//! The engine, server and CLI speak only of these: a backend crate turns them into its own
//! configuration and rejects what it cannot honour with an error naming the setting.

use std::fmt;
use std::str::FromStr;

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KvPrecision {
    F32,
    #[default]
    F16,
}

impl KvPrecision {
    /// Bytes per cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvPrecision::F32 => 4,
            KvPrecision::F16 => 2,
        }
    }
}

impl FromStr for KvPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(KvPrecision::F32),
            "f16" => Ok(KvPrecision::F16),
            _ => Err(format!("unknown KV cache type `{s}` (use f16 or f32)")),
        }
    }
}

impl fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
        })
    }
}

/// What a backend is asked to hold and how.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendSettings {
    /// Host threads (0: the backend's default, for the CPU its physical cores).
    pub threads: usize,
    /// Positions the KV cache holds per sequence.
    pub n_ctx: usize,
    /// Sequences the KV cache holds.
    pub n_seq: usize,
    /// Most tokens per batch.
    pub max_batch: usize,
    pub kv: KvPrecision,
    /// Which device of the backend's kind (`None`: its default choice).
    pub device: Option<usize>,
    /// Backend-specific settings as `name=value` pairs (the CPU's `kernels`, `act-quant`, ...).
    /// A backend rejects a name it does not know, so no setting is silently ignored.
    pub options: Vec<(String, String)>,
}

impl BackendSettings {
    /// The value of backend option `name`, if given.
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Fails naming the first option not in `known`.
    pub fn check_options(&self, backend: &str, known: &[&str]) -> Result<(), String> {
        for (n, _) in &self.options {
            if !known.contains(&n.as_str()) {
                let list = if known.is_empty() {
                    "it takes none".to_string()
                } else {
                    format!("it takes {}", known.join(", "))
                };
                return Err(format!(
                    "the {backend} backend has no setting `{n}` ({list})"
                ));
            }
        }
        Ok(())
    }
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            threads: 0,
            n_ctx: 2048,
            n_seq: 1,
            max_batch: 256,
            kv: KvPrecision::F16,
            device: None,
            options: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_options_are_named() {
        let s = BackendSettings {
            options: vec![("kernels".into(), "avx2".into())],
            ..Default::default()
        };
        assert!(s.check_options("cpu", &["kernels"]).is_ok());
        let e = s.check_options("vulkan", &[]).unwrap_err();
        assert!(e.contains("vulkan") && e.contains("`kernels`"), "{e}");
        assert_eq!(s.option("kernels"), Some("avx2"));
        assert_eq!(s.option("repack"), None);
    }

    #[test]
    fn kv_precision_parses() {
        assert_eq!("f32".parse::<KvPrecision>().unwrap(), KvPrecision::F32);
        assert!("q8".parse::<KvPrecision>().is_err());
    }
}
