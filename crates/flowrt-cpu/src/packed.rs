//! Weights repacked at load into the kernels' x8 layout (`flowrt_kernels::x8`: 8 rows
//! interleaved per block), held in one anonymous mapping advised for transparent huge pages.
//!
//! Only matrices read from a memory-mapped file are packed (GGUF tensors, and OpenAI's MXFP4
//! experts, whose ggml rows are made from the file's blocks a chunk at a time as they are
//! packed); their file pages are released once copied, so the resident set holds each weight
//! once. (Weights the process owns, e.g. those quantised at load, stay in ggml's row layout:
//! packing them would hold two copies.)
//! Each backend packs its own copy: two backends on one model (the server runs one per model)
//! would hold the packed weights twice.

use std::ops::Range;
use std::sync::Mutex;

use flowrt_dtype::GgmlType;
use flowrt_kernels::x8;
use flowrt_model::plan::MatRole;
use flowrt_model::{Model, WeightMatrix};
use memmap2::{Mmap, MmapOptions};

/// Layer matrices in the order of [`slot`]: the dense ones (routers stay F32).
const LAYER_ROLES: &[MatRole] = MatRole::IN_LAYER.split_at(9).0;

fn slot(role: MatRole) -> Option<usize> {
    LAYER_ROLES.iter().position(|&r| r == role)
}

/// Rows packed (and their file pages released) at a time: a multiple of the group size.
const PACK_ROWS: usize = 64 * x8::ROWS;

/// Packed copies of a model's matrices.
pub(crate) struct PackedWeights {
    mem: Option<Mmap>,
    layers: Vec<[Option<Range<usize>>; 9]>,
    /// Per layer, each expert's gate, up and down (empty for dense layers).
    experts: Vec<Vec<[Option<Range<usize>>; 3]>>,
    output: Option<Range<usize>>,
}

impl PackedWeights {
    /// Nothing packed: every matmul uses the row layout.
    pub(crate) fn none(n_layers: usize) -> Self {
        PackedWeights {
            mem: None,
            layers: vec![Default::default(); n_layers],
            experts: vec![Vec::new(); n_layers],
            output: None,
        }
    }

    /// Packs every matrix of `model` that has an x8 layout, using `threads` threads.
    pub(crate) fn build<'m>(model: &'m Model, threads: usize) -> std::io::Result<Self> {
        let mut me = Self::none(model.layers.len());
        let eligible =
            |m: &WeightMatrix| m.data.is_mapped() && x8::can_pack(m.dtype, m.rows, m.cols);
        let mut jobs: Vec<(&'m WeightMatrix, Range<usize>)> = Vec::new();
        let mut total = 0usize;
        let mut take = |m: &'m WeightMatrix| {
            let len = x8::packed_size(m.dtype, m.rows, m.cols);
            let r = total..total + len;
            total += len;
            jobs.push((m, r.clone()));
            r
        };
        for l in 0..model.layers.len() {
            for (s, &role) in LAYER_ROLES.iter().enumerate() {
                let Some(m) = model.matrix(Some(l), role) else {
                    continue;
                };
                if eligible(m) {
                    me.layers[l][s] = Some(take(m));
                }
            }
            if let Some(x) = &model.layers[l].moe {
                me.experts[l] = (0..x.gate.len())
                    .map(|e| {
                        [&x.gate[e], &x.up[e], &x.down[e]].map(|m| eligible(m).then(|| take(m)))
                    })
                    .collect();
            }
        }
        if let Some(output) = model.output.as_ref().filter(|m| eligible(m)) {
            me.output = Some(take(output));
        }
        if total == 0 {
            return Ok(me);
        }
        let mut mem = MmapOptions::new().len(total).map_anon()?;
        #[cfg(target_os = "linux")]
        {
            // Fewer TLB misses while streaming weights; a kernel without THP just says no.
            let _ = mem.advise(memmap2::Advice::HugePage);
        }
        // Hand each job its own slice of the mapping (jobs are in address order).
        let mut rest: &mut [u8] = &mut mem;
        let mut work = Vec::with_capacity(jobs.len());
        for (m, r) in jobs {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            rest = tail;
            work.push((m, dst));
        }
        let queue = Mutex::new(work);
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(|| loop {
                    let job = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
                    let Some((m, dst)) = job else { break };
                    // A chunk of rows at a time, each released once copied: at most a chunk
                    // per thread is resident twice.
                    // Rows made on demand (OpenAI's MXFP4 experts) are made a chunk at a
                    // time into `scratch`, never whole.
                    let rb = m.row_bytes;
                    let prb = x8::packed_row_bytes(m.dtype, m.cols);
                    let mut scratch = Vec::new();
                    for r0 in (0..m.rows).step_by(PACK_ROWS) {
                        let r1 = (r0 + PACK_ROWS).min(m.rows);
                        x8::pack(
                            m.dtype,
                            r1 - r0,
                            m.cols,
                            m.data.read(r0 * rb, (r1 - r0) * rb, &mut scratch),
                            &mut dst[r0 * prb..r1 * prb],
                        );
                        m.data.release_range(r0 * rb, (r1 - r0) * rb);
                    }
                });
            }
        });
        me.mem = Some(mem.make_read_only()?);
        Ok(me)
    }

    /// The packed bytes of a matrix, if it was packed.
    pub(crate) fn get(&self, layer: Option<usize>, role: MatRole) -> Option<&[u8]> {
        let r = match (role, layer) {
            (MatRole::Output, _) => self.output.as_ref(),
            (role, Some(l)) => self.layers.get(l)?[slot(role)?].as_ref(),
            (_, None) => None,
        }?;
        Some(&self.mem.as_ref()?[r.clone()])
    }

    /// The packed bytes of expert `e`'s gate (`which` 0), up (1) or down (2) matrix of
    /// `layer`, if it was packed.
    pub(crate) fn expert(&self, layer: usize, e: usize, which: usize) -> Option<&[u8]> {
        let r = self.experts.get(layer)?.get(e)?.get(which)?.as_ref()?;
        Some(&self.mem.as_ref()?[r.clone()])
    }

    /// Whether some packed matrix of `model` has a type `pred` accepts.
    pub(crate) fn any_of_type(&self, model: &Model, pred: impl Fn(GgmlType) -> bool) -> bool {
        let packed_and = |m: Option<&WeightMatrix>, p: Option<&[u8]>| {
            p.is_some() && m.is_some_and(|m| pred(m.dtype))
        };
        let in_layer = |l: usize| {
            let dense = LAYER_ROLES
                .iter()
                .any(|&role| packed_and(model.matrix(Some(l), role), self.get(Some(l), role)));
            let experts = model.layers[l].moe.as_ref().is_some_and(|x| {
                (0..x.gate.len()).any(|e| {
                    [&x.gate[e], &x.up[e], &x.down[e]]
                        .into_iter()
                        .enumerate()
                        .any(|(w, m)| packed_and(Some(m), self.expert(l, e, w)))
                })
            });
            dense || experts
        };
        (0..self.layers.len().min(model.layers.len())).any(in_layer)
            || packed_and(model.output.as_ref(), self.get(None, MatRole::Output))
    }

    /// Bytes of packed weights.
    pub(crate) fn bytes(&self) -> usize {
        self.mem.as_ref().map_or(0, |m| m.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowrt_model::{ModelConfig, WeightData};
    use std::path::Path;

    /// The gpt-oss fixture with its experts in OpenAI's MXFP4 safetensors layout.
    fn gptoss_mxfp4() -> Model {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/families/gpt-oss-mxfp4");
        let path = dir.join("config.json");
        let json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let cfg = ModelConfig::from_hf_json(&path, &json).unwrap();
        Model::from_hf_dir(&dir, cfg, Default::default()).unwrap()
    }

    /// OpenAI's MXFP4 experts go through the same x8 repack as a GGUF's mapped experts: every
    /// expert matrix is packed, equal to packing its ggml rows, and the packer never made a
    /// whole row-layout copy of them (the process holds the experts once).
    #[test]
    fn owned_mxfp4_experts_are_packed_without_a_row_copy() {
        let model = gptoss_mxfp4();
        let packed = PackedWeights::build(&model, 2).unwrap();
        let mut n = 0;
        for (l, layer) in model.layers.iter().enumerate() {
            let x = layer.moe.as_ref().unwrap();
            for e in 0..x.gate.len() {
                for (which, m) in [&x.gate[e], &x.up[e], &x.down[e]].into_iter().enumerate() {
                    assert_eq!(m.dtype, GgmlType::Mxfp4);
                    let WeightData::Mxfp4(rows) = &m.data else {
                        panic!("{} is not made on demand", m.name)
                    };
                    assert!(!rows.is_made(), "{}: the packer made a row copy", m.name);
                    let got = packed.expert(l, e, which).expect("expert packed");
                    // The reference: the whole ggml-layout matrix, packed in one go.
                    let mut want = vec![0u8; x8::packed_size(m.dtype, m.rows, m.cols)];
                    x8::pack(m.dtype, m.rows, m.cols, m.bytes(), &mut want);
                    assert!(rows.is_made());
                    assert_eq!(got, &want[..], "{}", m.name);
                    n += 1;
                }
            }
        }
        assert_eq!(n, 4 * 8 * 3);
    }
}
