//! The CPU backend's settings, from the generic backend settings and its own options.

use flowrt_dispatch::{BackendSettings, KvPrecision};
use flowrt_kernels::Kernels;

use super::{ActQuant, AttnSplit, BackendError};
use crate::kv::KvType;

/// Settings of a CPU backend instance.
#[derive(Clone, Debug)]
pub struct CpuOptions {
    /// Threads in total (the calling thread included).
    pub threads: usize,
    /// Context length: positions the KV cache holds.
    pub n_ctx: usize,
    /// Element type of the KV cache.
    pub kv_type: KvType,
    /// Most tokens one `execute` call may carry (prompts are prefilled in batches of this).
    pub max_batch: usize,
    /// Sequences the KV cache holds (each `n_ctx` positions); a batch may mix them.
    pub n_seq: usize,
    /// Kernels to use (defaults to the best the host supports).
    pub kernels: Option<&'static Kernels>,
    /// Activation quantisation for quantised weights.
    pub act_quant: ActQuant,
    /// Repack the weights that have an x8 layout (`flowrt_kernels::x8`) at creation: faster
    /// matmuls; needs `act_quant` Q16 and a SIMD kernel table (otherwise ignored).
    pub repack: bool,
    /// How attention splits long key ranges over threads (see [`AttnSplit`]).
    pub attn_split: AttnSplit,
}

/// The backend options (`BackendSettings::options`) the CPU takes:
///
/// - `kernels`: the kernel table, as [`Kernels::select`] names them (`scalar`, `avx2`,
///   `avx512`, `avx512vnni`, `neon`); without it the best the host runs, or `FLOWRT_KERNELS`.
/// - `act-quant`: `q16` (the default), `q8x` or `q8` (see [`ActQuant`]).
/// - `repack`: `true` (the default) or `false` (see [`CpuOptions::repack`]).
/// - `attn-split`: `auto` (the default), `off`, or a number of parts (see [`AttnSplit`]).
pub const CPU_OPTIONS: [&str; 4] = ["kernels", "act-quant", "repack", "attn-split"];

impl CpuOptions {
    /// The CPU's configuration for generic `settings`: threads 0 means the physical cores,
    /// the KV precision maps to [`KvType`], and the backend options ([`CPU_OPTIONS`]) are
    /// parsed; an option the CPU does not take, a value it cannot parse or a device other than
    /// 0 (the CPU is one device) is an error naming it.
    pub fn from_settings(s: &BackendSettings) -> Result<CpuOptions, BackendError> {
        s.check_options("cpu", &CPU_OPTIONS)
            .map_err(BackendError::UnknownSetting)?;
        if let Some(index) = s.device.filter(|&d| d != 0) {
            return Err(BackendError::NoSuchDevice { index });
        }
        let bad = |name: &'static str, value: &str, reason: String| BackendError::BadSetting {
            name,
            value: value.to_string(),
            reason,
        };
        let kernels = match s.option("kernels") {
            Some(v) => Some(
                Kernels::select(Some(v)).map_err(|error| BackendError::Kernels {
                    value: v.to_string(),
                    error,
                })?,
            ),
            // `Kernels::detect` (at creation) honours FLOWRT_KERNELS.
            None => None,
        };
        let act_quant = match s.option("act-quant") {
            Some(v) => v.parse().map_err(|r| bad("act-quant", v, r))?,
            None => ActQuant::default(),
        };
        let repack = match s.option("repack") {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => return Err(bad("repack", v, "use true or false".into())),
        };
        let attn_split = match s.option("attn-split") {
            Some(v) => v.parse().map_err(|r| bad("attn-split", v, r))?,
            None => AttnSplit::default(),
        };
        Ok(CpuOptions {
            threads: match s.threads {
                0 => crate::physical_cores(),
                n => n,
            },
            n_ctx: s.n_ctx,
            kv_type: match s.kv {
                KvPrecision::F16 => KvType::F16,
                KvPrecision::F32 => KvType::F32,
            },
            max_batch: s.max_batch,
            n_seq: s.n_seq,
            kernels,
            act_quant,
            repack,
            attn_split,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(options: &[(&str, &str)]) -> BackendSettings {
        BackendSettings {
            options: options
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            ..BackendSettings::default()
        }
    }

    #[test]
    fn settings_map_to_cpu_options() {
        let o = CpuOptions::from_settings(&BackendSettings {
            threads: 3,
            n_ctx: 100,
            n_seq: 2,
            max_batch: 7,
            kv: KvPrecision::F32,
            device: Some(0),
            options: Vec::new(),
        })
        .unwrap();
        assert_eq!((o.threads, o.n_ctx, o.n_seq, o.max_batch), (3, 100, 2, 7));
        assert_eq!(o.kv_type, KvType::F32);
        // The defaults: best kernels (decided at creation), Q16, repacked, automatic split.
        assert!(o.kernels.is_none());
        assert_eq!(o.act_quant, ActQuant::Q16);
        assert!(o.repack);
        assert_eq!(o.attn_split, AttnSplit::Auto);
        let o = CpuOptions::from_settings(&BackendSettings::default()).unwrap();
        assert_eq!(
            o.threads,
            crate::physical_cores(),
            "threads 0: physical cores"
        );
        assert_eq!(o.kv_type, KvType::F16);

        let o = CpuOptions::from_settings(&settings(&[
            ("kernels", "scalar"),
            ("act-quant", "q8"),
            ("repack", "false"),
            ("attn-split", "3"),
        ]))
        .unwrap();
        assert_eq!(o.kernels.map(|k| k.name()), Some("scalar"));
        assert_eq!(o.act_quant, ActQuant::Q8);
        assert!(!o.repack);
        assert_eq!(o.attn_split, AttnSplit::Parts(3));
        for (v, want) in [("off", AttnSplit::Off), ("auto", AttnSplit::Auto)] {
            let o = CpuOptions::from_settings(&settings(&[("attn-split", v)])).unwrap();
            assert_eq!(o.attn_split, want);
            assert_eq!(want.to_string(), v);
        }
    }

    #[test]
    fn bad_settings_are_named() {
        let e = CpuOptions::from_settings(&settings(&[("kernels", "avx2"), ("colour", "red")]))
            .unwrap_err();
        assert!(matches!(e, BackendError::UnknownSetting(_)), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("`colour`"), "{msg}");
        for name in CPU_OPTIONS {
            assert!(msg.contains(name), "{msg} lacks {name}");
        }
        for (name, value) in [
            ("kernels", "sse9"),
            ("act-quant", "q4"),
            ("repack", "yes"),
            ("attn-split", "0"),
            ("attn-split", "many"),
        ] {
            let e = CpuOptions::from_settings(&settings(&[(name, value)])).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("`{name}={value}`")), "{msg}");
        }
        let e = CpuOptions::from_settings(&BackendSettings {
            device: Some(2),
            ..BackendSettings::default()
        })
        .unwrap_err();
        assert!(
            matches!(e, BackendError::NoSuchDevice { index: 2 }),
            "{e:?}"
        );
    }
}
