//! The short gated convolution of hybrid models (LFM2), spread over the thread pool.
//!
//! Per row `t` at position `pos` of sequence `seq`, with `src` holding `B`, `C` and `x`:
//! `dst = C ⊙ (Σ_j w_j · Bx[pos - (K - 1) + j] + conv_bias)`, where `Bx = B ⊙ x` of earlier
//! positions comes from the sequence's convolution cache (positions before 0 count as 0), and
//! every row's own `Bx` is written there first (a row reads earlier rows' values of the same
//! batch).
//!
//! Channels are independent: a task owns a block of channels of every row of the batch, writes
//! those channels' `Bx` of each row into the cache, then convolves them row by row. Each
//! channel sees the same additions in the same order whatever the blocks, so the result does
//! not depend on the thread count, and rows of one sequence (or two rows of one position) keep
//! their order because one task handles all rows of its channels.

use flowrt_kernels::Kernels;
use flowrt_model::plan::Buf;

use super::{two_bufs, CpuBackend};
use crate::kv::{self, as_f16_mut, KvStore};
use crate::pool::ColumnWriter;

/// Fewest `rows × channels` worth a job on the pool: below this (one or two rows at real widths,
/// such as one sequence's decode step) the op takes microseconds and waking the workers costs
/// as much, so it runs on the calling thread.
const MIN_PARALLEL: usize = 2048;

/// Channels of one task for `n` rows of `h` channels: the whole width on one thread (one
/// thread, or little work), else about four blocks per thread, in whole multiples of 16.
fn channel_block(h: usize, n: usize, threads: usize) -> usize {
    if threads <= 1 || n * h < MIN_PARALLEL {
        return h.max(1);
    }
    h.div_ceil(4 * threads).next_multiple_of(16)
}

/// Values of `Bx` staged on the stack on their way into the cache (an f16 cache converts them
/// at once).
const STAGE: usize = 32;

/// An element of the convolution cache: f16 bits or f32.
trait CacheElem: Copy + Send {
    fn store(k: &Kernels, x: &[f32], out: &mut [Self]);
    fn load(self) -> f32;
}

impl CacheElem for u16 {
    fn store(k: &Kernels, x: &[f32], out: &mut [u16]) {
        k.f32_to_f16(x, as_f16_mut(out));
    }
    fn load(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }
}

impl CacheElem for f32 {
    fn store(_: &Kernels, x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
    }
    fn load(self) -> f32 {
        self
    }
}

/// What every channel block of one layer's convolution reads.
struct Conv<'a> {
    k: &'a Kernels,
    src: &'a [f32],               // (n, 3 * h) each row's B, C and x
    rows: &'a [(usize, usize)],   // (n) sequence and position of each row
    n_ctx: usize,                 // positions per sequence in the cache
    h: usize,                     // channels
    kernel: usize,                // taps
    w: &'a [f32],                 // (h, kernel) taps of each channel
    conv_bias: Option<&'a [f32]>, // (h)
}

impl Conv<'_> {
    /// Channels `c0..` (the writers' columns) of every row: their `Bx` into `cache` (rows of
    /// `h`, one per sequence and position), then the gated convolution into `out` (rows of
    /// `h`, one per row of the batch).
    fn block<T: CacheElem>(
        &self,
        c0: usize,
        cache: &mut ColumnWriter<'_, T>,
        out: &mut ColumnWriter<'_, f32>,
    ) {
        let (h, kernel) = (self.h, self.kernel);
        let mut stage = [0f32; STAGE];
        for (t, &(seq, pos)) in self.rows.iter().enumerate() {
            let dst = cache.row(kv::conv_row(self.n_ctx, seq, pos));
            let c1 = c0 + dst.len();
            let r = &self.src[t * 3 * h..(t + 1) * 3 * h];
            let (b, x) = (&r[c0..c1], &r[2 * h + c0..2 * h + c1]);
            for ((d, b), x) in dst
                .chunks_mut(STAGE)
                .zip(b.chunks(STAGE))
                .zip(x.chunks(STAGE))
            {
                let st = &mut stage[..d.len()];
                for (o, (b, x)) in st.iter_mut().zip(b.iter().zip(x)) {
                    *o = b * x;
                }
                T::store(self.k, st, d);
            }
        }
        for (t, &(seq, pos)) in self.rows.iter().enumerate() {
            let o = out.row(t);
            let c1 = c0 + o.len();
            o.fill(0.0);
            for j in 0..kernel {
                let back = kernel - 1 - j;
                if back > pos {
                    continue;
                }
                let past = cache.row(kv::conv_row(self.n_ctx, seq, pos - back));
                for (ch, (acc, v)) in (c0..c1).zip(o.iter_mut().zip(past.iter())) {
                    *acc += self.w[ch * kernel + j] * v.load();
                }
            }
            // The convolution's bias (LFM2 `conv_bias`), before the C gate.
            if let Some(b) = self.conv_bias {
                self.k.add(o, &b[c0..c1]);
            }
            let cg = &self.src[t * 3 * h + h + c0..t * 3 * h + h + c1];
            for (acc, c) in o.iter_mut().zip(cg) {
                *acc *= c;
            }
        }
    }
}

impl CpuBackend {
    /// `dst = C ⊙ (conv(B ⊙ x) + conv_bias)` of the batch's `n` rows for convolution layer
    /// `l` with `kernel` taps, `src` holding each row's `B`, `C` and `x` (see the module docs).
    pub(super) fn short_conv(
        &mut self,
        l: usize,
        src: Buf,
        dst: Buf,
        kernel: usize,
        n: usize,
    ) -> Result<(), String> {
        let h = self.model.config.hidden_size;
        let cw = self.model.layers[l]
            .conv
            .as_ref()
            .ok_or("the layer has no short convolution weights")?;
        let (w, conv_bias) = (&cw.kernel, cw.kernel_bias.as_deref());
        if self.kv.conv_width[l] != h
            || w.len() != h * kernel
            || conv_bias.is_some_and(|b| b.len() != h)
        {
            return Err("the layer's convolution cache or kernel has the wrong size".into());
        }
        let (s, d) = two_bufs(&mut self.bufs, src, dst);
        let conv = Conv {
            k: self.kernels,
            src: &s[..n * 3 * h],
            rows: &self.rows[..n],
            n_ctx: self.kv.n_ctx,
            h,
            kernel,
            w,
            conv_bias,
        };
        let blk = channel_block(h, n, self.pool.n_threads());
        let block = |i: usize| (i * blk, ((i + 1) * blk).min(h));
        let n_blocks = h.div_ceil(blk);
        let out = &mut d[..n * h];
        match &mut self.kv.k[l] {
            KvStore::F16(st) => self.pool.for_each_column_block_pair(
                st,
                out,
                (h, h),
                n_blocks,
                &block,
                &|_, i, c, o| conv.block(block(i).0, c, o),
            ),
            KvStore::F32(st) => self.pool.for_each_column_block_pair(
                st,
                out,
                (h, h),
                n_blocks,
                &block,
                &|_, i, c, o| conv.block(block(i).0, c, o),
            ),
        }
        Ok(())
    }
}
