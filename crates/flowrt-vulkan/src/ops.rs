//! WGSL kernels of the ops that do not read weight matrices: norms, RoPE, the KV cache,
//! attention, activations, residuals and logits. Each kernel reads the per-step uniform
//! (`Step`: tokens and logit rows of the batch) and its own uniform of constants fixed at
//! creation, so every bind group is made once.

/// Threads of the element-wise kernels' workgroups.
pub const EW: u32 = 256;
/// Most head_dim the attention kernel holds (each of its 64 threads keeps 4 dimensions).
pub const MAX_HEAD_DIM: usize = 256;

const STEP: &str = r#"
struct Step { n_tok: u32, n_out: u32, p0: u32, p1: u32 }
"#;

/// Element-wise kernels index `gid` over a 2-D grid of `EW`-thread workgroups.
const GID: &str = r#"
fn gid_of(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + li;
}
"#;

/// `tanh` without overflow in implementations that compute it from `exp`.
const TANH: &str = r#"
fn tanh_safe(x: f32) -> f32 {
    return tanh(clamp(x, -15.0, 15.0));
}
"#;

fn with_common(body: &str) -> String {
    format!("{STEP}{GID}{TANH}{body}")
}

/// RMSNorm of `rows_per_tok` rows of `width` values per token: `dst = src / rms(src) * w`,
/// `src` and `dst` different buffers.
pub fn rms_norm() -> String {
    rms_norm_kernel(false)
}

/// RMSNorm in place (QK-norm: each head of `Q` or `K` is a row).
pub fn rms_norm_inplace() -> String {
    rms_norm_kernel(true)
}

fn rms_norm_kernel(inplace: bool) -> String {
    let (bufs, src, dst) = if inplace {
        (
            r#"
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<uniform> p: P;
@group(0) @binding(3) var<uniform> step: Step;"#,
            "x",
            "x",
        )
    } else {
        (
            r#"
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;"#,
            "src",
            "dst",
        )
    };
    with_common(&format!(
        r#"
struct P {{ width: u32, rows_per_tok: u32, eps: f32, p0: u32 }}
{bufs}
var<workgroup> part: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {{
    let row = wg.y * nwg.x + wg.x;
    if (row >= step.n_tok * p.rows_per_tok) {{ return; }}
    let base = row * p.width;
    var ss = 0.0;
    for (var i = li.x; i < p.width; i += 64u) {{ let v = {src}[base + i]; ss += v * v; }}
    part[li.x] = ss;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s >>= 1u) {{
        if (li.x < s) {{ part[li.x] += part[li.x + s]; }}
        workgroupBarrier();
    }}
    let inv = 1.0 / sqrt(part[0] / f32(p.width) + p.eps);
    for (var i = li.x; i < p.width; i += 64u) {{ {dst}[base + i] = {src}[base + i] * inv * w[i]; }}
}}
"#
    ))
}

/// RoPE in place on `heads` heads of `head_dim` per token, rotating the first `2 * half`
/// dimensions by the table's cos/sin at the token's position. `pairing` 0: adjacent pairs
/// (2i, 2i+1); 1: halves (i, i + half).
pub fn rope() -> String {
    with_common(
        r#"
struct P { heads: u32, head_dim: u32, half: u32, pairing: u32, n_ctx: u32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<u32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {
    let g = gid_of(wg, nwg, li.x);
    let per_tok = p.heads * p.half;
    if (g >= step.n_tok * per_tok) { return; }
    let t = g / per_tok;
    let r = g % per_tok;
    let head = r / p.half;
    let i = r % p.half;
    let pos = rows[2u * t + 1u];
    let c = table[pos * p.half + i];
    let s = table[p.n_ctx * p.half + pos * p.half + i];
    let base = (t * p.heads + head) * p.head_dim;
    var ia = base + 2u * i;
    var ib = ia + 1u;
    if (p.pairing == 1u) { ia = base + i; ib = base + i + p.half; }
    let a = x[ia];
    let b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
}
"#,
    )
}

/// Appends `K` and `V` rows to a layer's cache at each token's (sequence, position). Cache
/// layout: `[(seq * kv_heads + g) * n_ctx + pos] * head_dim`, f32 or (with `F16`) pairs of
/// f16 in u32 words.
pub fn store_kv(f16: bool) -> String {
    let (ty, body) = if f16 {
        (
            "u32",
            r#"
    let d2 = r % (p.head_dim / 2u);
    let g = r / (p.head_dim / 2u);
    let src = t * p.kv_dim + g * p.head_dim + 2u * d2;
    let o = (((seq * p.kv_heads + g) * p.n_ctx + pos) * p.head_dim) / 2u + d2;
    kc[o] = pack2x16float(vec2<f32>(k[src], k[src + 1u]));
    vc[o] = pack2x16float(vec2<f32>(v[src], v[src + 1u]));
"#,
        )
    } else {
        (
            "f32",
            r#"
    let d = r % p.head_dim;
    let g = r / p.head_dim;
    let src = t * p.kv_dim + g * p.head_dim + d;
    let o = ((seq * p.kv_heads + g) * p.n_ctx + pos) * p.head_dim + d;
    kc[o] = k[src];
    vc[o] = v[src];
"#,
        )
    };
    let per = if f16 { "p.kv_dim / 2u" } else { "p.kv_dim" };
    with_common(&format!(
        r#"
struct P {{ kv_dim: u32, head_dim: u32, kv_heads: u32, n_ctx: u32 }}
@group(0) @binding(0) var<storage, read> k: array<f32>;
@group(0) @binding(1) var<storage, read> v: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<{ty}>;
@group(0) @binding(3) var<storage, read_write> vc: array<{ty}>;
@group(0) @binding(4) var<storage, read> rows: array<u32>;
@group(0) @binding(5) var<uniform> p: P;
@group(0) @binding(6) var<uniform> step: Step;

{entry}"#,
        entry = row_store_entry(per, body)
    ))
}

/// The entry point of a store into a per-(sequence, position) cache: one thread per (token,
/// element `r` of `per` a token), with the token's `seq` and `pos` from `rows`, then `body`.
fn row_store_entry(per: &str, body: &str) -> String {
    format!(
        r#"@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {{
    let gi = gid_of(wg, nwg, li.x);
    let per_tok = {per};
    if (gi >= step.n_tok * per_tok) {{ return; }}
    let t = gi / per_tok;
    let r = gi % per_tok;
    let seq = rows[2u * t];
    let pos = rows[2u * t + 1u];
{body}
}}
"#
    )
}

/// Causal GQA attention over a layer's cache, one workgroup per (query head, token): keys in
/// chunks of 64 with a running max and sum (each of the 64 threads scores one key of a chunk,
/// then accumulates its 4 output dimensions over the chunk). With `window > 0`, a query at
/// position `p` sees positions `p - window + 1 ..= p`. With `sinks` 1, head `h`'s sink logit
/// `sink[h]` joins each softmax's denominator (`exp(s_j) / (Σ exp(s_i) + exp(sink))`). With
/// `softcap > 0`, every scaled score `s` becomes `softcap · tanh(s / softcap)` (Gemma 2).
pub fn attention(f16: bool) -> String {
    let (ty, kdot, vget) = if f16 {
        (
            "u32",
            r#"
        let kb = (kv_base + j * p.head_dim) / 2u;
        for (var d = 0u; d < p.head_dim / 2u; d++) {
            let kk = unpack2x16float(kc[kb + d]);
            s += qs[2u * d] * kk.x + qs[2u * d + 1u] * kk.y;
        }
"#,
            r#"
fn v_at(i: u32) -> f32 {
    let w = unpack2x16float(vc[i / 2u]);
    return select(w.x, w.y, (i & 1u) == 1u);
}
"#,
        )
    } else {
        (
            "f32",
            r#"
        let kb = kv_base + j * p.head_dim;
        for (var d = 0u; d < p.head_dim; d++) { s += qs[d] * kc[kb + d]; }
"#,
            r#"
fn v_at(i: u32) -> f32 { return vc[i]; }
"#,
        )
    };
    with_common(&format!(
        r#"
struct P {{ heads: u32, kv_heads: u32, head_dim: u32, n_ctx: u32, window: u32, scale: f32, sinks: u32, softcap: f32 }}
@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<{ty}>;
@group(0) @binding(2) var<storage, read> vc: array<{ty}>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> rows: array<u32>;
@group(0) @binding(5) var<storage, read> sink: array<f32>;
@group(0) @binding(6) var<uniform> p: P;
@group(0) @binding(7) var<uniform> step: Step;
var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> wpos: u32;
var<workgroup> wseq: u32;
{vget}
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {{
    let head = wg.x;
    let t = wg.y;
    if (t >= step.n_tok) {{ return; }}
    let l = li.x;
    if (l == 0u) {{ wseq = rows[2u * t]; wpos = rows[2u * t + 1u]; }}
    let qbase = (t * p.heads + head) * p.head_dim;
    for (var i = l; i < p.head_dim; i += 64u) {{ qs[i] = q[qbase + i]; }}
    let pos = workgroupUniformLoad(&wpos);
    let seq = workgroupUniformLoad(&wseq);
    let g = head / (p.heads / p.kv_heads);
    let kv_base = (seq * p.kv_heads + g) * p.n_ctx * p.head_dim;
    var start = 0u;
    if (p.window > 0u && pos + 1u > p.window) {{ start = pos + 1u - p.window; }}
    var m = -3.0e38;
    var lsum = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = start; c0 <= pos; c0 += 64u) {{
        let j = c0 + l;
        var s = -3.0e38;
        if (j <= pos) {{
            s = 0.0;
{kdot}
            s *= p.scale;
            if (p.softcap > 0.0) {{ s = p.softcap * tanh_safe(s / p.softcap); }}
        }}
        sc[l] = s;
        red[l] = s;
        workgroupBarrier();
        for (var w = 32u; w > 0u; w >>= 1u) {{
            if (l < w) {{ red[l] = max(red[l], red[l + w]); }}
            workgroupBarrier();
        }}
        let m_new = max(m, red[0]);
        let alpha = exp(m - m_new);
        workgroupBarrier();
        var pj = 0.0;
        if (j <= pos) {{ pj = exp(s - m_new); }}
        sc[l] = pj;
        red[l] = pj;
        workgroupBarrier();
        for (var w = 32u; w > 0u; w >>= 1u) {{
            if (l < w) {{ red[l] += red[l + w]; }}
            workgroupBarrier();
        }}
        lsum = lsum * alpha + red[0];
        acc *= alpha;
        let nk = min(64u, pos + 1u - c0);
        for (var jj = 0u; jj < nk; jj++) {{
            let pw = sc[jj];
            let vb = kv_base + (c0 + jj) * p.head_dim;
            for (var e = 0u; e < 4u; e++) {{
                let d = l + 64u * e;
                if (d < p.head_dim) {{ acc[e] += pw * v_at(vb + d); }}
            }}
        }}
        m = m_new;
        workgroupBarrier();
    }}
    // A sink logit (`sinks` 1: one per head) joins the denominator, with no value.
    if (p.sinks == 1u) {{ lsum += exp(sink[head] - m); }}
    for (var e = 0u; e < 4u; e++) {{
        let d = l + 64u * e;
        if (d < p.head_dim) {{ out[qbase + d] = acc[e] / lsum; }}
    }}
}}
"#
    ))
}

/// An element-wise kernel: one thread per item `i < count`, `buffers` (`name: access`, at
/// bindings 0, 1, ...) then the uniforms `p` (struct `P { fields }`) and `step`.
fn elementwise(fields: &str, buffers: &[(&str, &str)], count: &str, body: &str) -> String {
    let mut decls = String::new();
    for (k, (name, access)) in buffers.iter().enumerate() {
        decls.push_str(&format!(
            "@group(0) @binding({k}) var<storage, {access}> {name}: array<f32>;\n"
        ));
    }
    let n = buffers.len();
    with_common(&format!(
        r#"
struct P {{ {fields} }}
{decls}@group(0) @binding({n}) var<uniform> p: P;
@group(0) @binding({}) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {{
    let i = gid_of(wg, nwg, li.x);
    if (i >= {count}) {{ return; }}
{body}
}}
"#,
        n + 1
    ))
}

/// `gate = act(gate) * up` over `width` values per token; `act` 0: SiLU, 1: GELU (tanh),
/// 2: the clamped SwiGLU (`alpha`, `limit`): `min(g, limit) σ(α min(g, limit)) (clamp(u, ±limit) + 1)`.
pub fn gated_act() -> String {
    elementwise(
        "width: u32, act: u32, alpha: f32, limit: f32",
        &[("gate", "read_write"), ("up", "read")],
        "step.n_tok * p.width",
        r#"    let g = gate[i];
    var a: f32;
    if (p.act == 0u) {
        a = g / (1.0 + exp(-g));
    } else if (p.act == 2u) {
        let x = min(g, p.limit);
        gate[i] = x / (1.0 + exp(-p.alpha * x)) * (clamp(up[i], -p.limit, p.limit) + 1.0);
        return;
    } else {
        a = 0.5 * g * (1.0 + tanh_safe(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    }
    gate[i] = a * up[i];"#,
    )
}

/// A mixture of experts' routing, one thread per token: from its router logits (`experts`
/// per token) the `top_k` experts with the highest scores (ties to the lower index, as the
/// CPU's `route`) into `ids[t * top_k + s]` (best first) and their weights into
/// `wts[t * top_k + s]`. `scoring` 0: softmax scores over all experts; 1: chosen by raw logit,
/// weighted by a softmax over the chosen; 2: sigmoid scores. With `has_bias` 1 the choice
/// ranks by score + `bias[e]` (a selection bias), the weights stay the unbiased scores. For
/// scorings 0 and 2 with `renorm` 1 the chosen weights are divided by their sum +
/// `renorm_eps`; then every weight is multiplied by `scale`.
pub fn moe_route() -> String {
    with_common(
        r#"
struct P { experts: u32, top_k: u32, scoring: u32, renorm: u32,
           renorm_eps: f32, scale: f32, has_bias: u32, p0: u32 }
@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> wts: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

fn score(base: u32, e: u32, mx: f32, sum: f32) -> f32 {
    let l = logits[base + e];
    if (p.scoring == 0u) { return exp(l - mx) / sum; }
    if (p.scoring == 2u) { return 1.0 / (1.0 + exp(-l)); }
    return l;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {
    let t = gid_of(wg, nwg, li.x);
    if (t >= step.n_tok) { return; }
    let base = t * p.experts;
    let ob = t * p.top_k;
    var mx = logits[base];
    for (var e = 1u; e < p.experts; e++) { mx = max(mx, logits[base + e]); }
    var sum = 0.0;
    if (p.scoring == 0u) {
        for (var e = 0u; e < p.experts; e++) { sum += exp(logits[base + e] - mx); }
    }
    let k = min(p.top_k, p.experts);
    for (var s = 0u; s < k; s++) {
        var best = 0xffffffffu;
        var bs = 0.0;
        var bk = 0.0;
        for (var e = 0u; e < p.experts; e++) {
            var taken = false;
            for (var q = 0u; q < s; q++) { if (ids[ob + q] == e) { taken = true; } }
            if (taken) { continue; }
            let v = score(base, e, mx, sum);
            var key = v;
            if (p.has_bias == 1u) { key = v + bias[e]; }
            if (best == 0xffffffffu || key > bk) { best = e; bs = v; bk = key; }
        }
        ids[ob + s] = best;
        wts[ob + s] = bs;
    }
    if (p.scoring == 1u) {
        let top = wts[ob];
        var z = 0.0;
        for (var s = 0u; s < k; s++) { let w = exp(wts[ob + s] - top); wts[ob + s] = w; z += w; }
        for (var s = 0u; s < k; s++) { wts[ob + s] = wts[ob + s] / z; }
    } else if (p.renorm == 1u) {
        var z = 0.0;
        for (var s = 0u; s < k; s++) { z += wts[ob + s]; }
        z += p.renorm_eps;
        if (z > 0.0) {
            for (var s = 0u; s < k; s++) { wts[ob + s] = wts[ob + s] / z; }
        }
    }
    if (p.scale != 1.0) {
        for (var s = 0u; s < k; s++) { wts[ob + s] = wts[ob + s] * p.scale; }
    }
}
"#,
    )
}

/// A short convolution's input (one thread per value, or per pair of values in f16): with
/// `src`'s rows split into `width`-wide parts `(B, C, x)`, `B · x` of each token into the
/// layer's cache at its sequence and position, laid out `[seq][position][width]` (f16 in u32
/// words when `f16`).
pub fn conv_store(f16: bool) -> String {
    let (ty, per, body) = if f16 {
        (
            "u32",
            "p.width / 2u",
            r#"
    let c = 2u * r;
    let s = t * 3u * p.width;
    let o = ((seq * p.n_ctx + pos) * p.width) / 2u + r;
    cache[o] = pack2x16float(vec2<f32>(src[s + c] * src[s + 2u * p.width + c],
                                       src[s + c + 1u] * src[s + 2u * p.width + c + 1u]));
"#,
        )
    } else {
        (
            "f32",
            "p.width",
            r#"
    let s = t * 3u * p.width;
    let o = (seq * p.n_ctx + pos) * p.width + r;
    cache[o] = src[s + r] * src[s + 2u * p.width + r];
"#,
        )
    };
    with_common(&format!(
        r#"
struct P {{ width: u32, n_ctx: u32, kernel: u32, has_bias: u32 }}
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> cache: array<{ty}>;
@group(0) @binding(2) var<storage, read> rows: array<u32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

{entry}"#,
        entry = row_store_entry(per, body)
    ))
}

/// A short convolution over the layer's cache (after `conv_store`), one thread per (token,
/// channel): `dst[t, c] = C[t, c] · (Σ_j w[c · kernel + j] · Bx[pos - (kernel - 1) + j, c]
/// + bias[c])`, a position before 0 as 0, the bias only with `has_bias` 1; `C` is the middle
/// part of `src`'s row.
pub fn short_conv(f16: bool) -> String {
    let (ty, get) = if f16 {
        (
            "u32",
            "fn bx(o: u32) -> f32 { return unpack2x16float(cache[o / 2u])[o % 2u]; }",
        )
    } else {
        ("f32", "fn bx(o: u32) -> f32 { return cache[o]; }")
    };
    with_common(&format!(
        r#"
struct P {{ width: u32, n_ctx: u32, kernel: u32, has_bias: u32 }}
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> cache: array<{ty}>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> rows: array<u32>;
@group(0) @binding(6) var<uniform> p: P;
@group(0) @binding(7) var<uniform> step: Step;
{get}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {{
    let gi = gid_of(wg, nwg, li.x);
    if (gi >= step.n_tok * p.width) {{ return; }}
    let t = gi / p.width;
    let c = gi % p.width;
    let seq = rows[2u * t];
    let pos = rows[2u * t + 1u];
    var acc = 0.0;
    for (var j = 0u; j < p.kernel; j++) {{
        let back = p.kernel - 1u - j;
        if (back > pos) {{ continue; }}
        acc += w[c * p.kernel + j] * bx((seq * p.n_ctx + pos - back) * p.width + c);
    }}
    if (p.has_bias == 1u) {{ acc += bias[c]; }}
    dst[gi] = acc * src[t * 3u * p.width + p.width + c];
}}
"#
    ))
}

/// Groups the step's `n_tok * top_k` (token, slot) pairs by expert for the grouped expert
/// matmul, in one workgroup: `cnt[e]` the pairs that chose expert `e` and `cnt[experts + e]`
/// the first of them in `perm`; `perm` the pair indices expert-major, ascending within an
/// expert (so tokens ascending); `tiles[0]` the number of tiles and then per tile `(e, s0,
/// s1)`: expert `e`'s pairs `perm[s0..min(s0 + tile, s1)]`, `s1` the end of its pairs. An id
/// outside `0..experts` is in no tile (as the per-pair form, which skips it).
pub fn moe_group() -> String {
    with_common(
        r#"
struct P { experts: u32, top_k: u32, tile: u32, p0: u32 }
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read_write> cnt: array<u32>;
@group(0) @binding(2) var<storage, read_write> perm: array<u32>;
@group(0) @binding(3) var<storage, read_write> tiles: array<u32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32) {
    let n = step.n_tok * p.top_k;
    for (var e = li; e < p.experts; e += 64u) {
        var c = 0u;
        for (var q = 0u; q < n; q++) {
            if (ids[q] == e) { c++; }
        }
        cnt[e] = c;
    }
    storageBarrier();
    if (li == 0u) {
        var off = 0u;
        var nt = 0u;
        for (var e = 0u; e < p.experts; e++) {
            let c = cnt[e];
            cnt[p.experts + e] = off;
            for (var s = 0u; s < c; s += p.tile) {
                tiles[1u + 3u * nt] = e;
                tiles[2u + 3u * nt] = off + s;
                tiles[3u + 3u * nt] = off + c;
                nt++;
            }
            off += c;
        }
        tiles[0] = nt;
    }
    storageBarrier();
    for (var e = li; e < p.experts; e += 64u) {
        var o = cnt[p.experts + e];
        for (var q = 0u; q < n; q++) {
            if (ids[q] == e) {
                perm[o] = q;
                o++;
            }
        }
    }
}
"#,
    )
}

/// Per-expert biases: `y[p, j] += b[ids[p] * width + j]` over the step's `n_tok * top_k`
/// (token, slot) pairs of `width` values.
pub fn moe_bias() -> String {
    with_common(
        r#"
struct P { width: u32, top_k: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {
    let i = gid_of(wg, nwg, li.x);
    if (i >= step.n_tok * p.top_k * p.width) { return; }
    y[i] += b[ids[i / p.width] * p.width + i % p.width];
}
"#,
    )
}

/// A mixture of experts' weighted sum: `dst[t, j] = sum_s wts[t, s] * out[t * top_k + s, j]`
/// over `width` values per token, the slots taken in ascending expert id (the CPU adds its
/// experts' outputs in expert order).
pub fn moe_combine() -> String {
    with_common(
        r#"
struct P { width: u32, top_k: u32, p0: u32, p1: u32 }
@group(0) @binding(0) var<storage, read> out: array<f32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<uniform> p: P;
@group(0) @binding(5) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {
    let i = gid_of(wg, nwg, li.x);
    if (i >= step.n_tok * p.width) { return; }
    let t = i / p.width;
    let j = i % p.width;
    let ob = t * p.top_k;
    var acc = 0.0;
    var prev = 0u;
    var first = true;
    for (var q = 0u; q < p.top_k; q++) {
        // The slot with the next larger expert id.
        var s = 0xffffffffu;
        for (var c = 0u; c < p.top_k; c++) {
            let e = ids[ob + c];
            if ((first || e > prev) && (s == 0xffffffffu || e < ids[ob + s])) { s = c; }
        }
        if (s == 0xffffffffu) { break; }
        prev = ids[ob + s];
        first = false;
        acc += wts[ob + s] * out[(ob + s) * p.width + j];
    }
    dst[i] = acc;
}
"#,
    )
}

/// `x += src * scale` over `width` values per token.
pub fn add_residual() -> String {
    elementwise(
        "width: u32, scale: f32, p0: u32, p1: u32",
        &[("x", "read_write"), ("src", "read")],
        "step.n_tok * p.width",
        "    x[i] += src[i] * p.scale;",
    )
}

/// `y[t, i] += b[i]` over `width` values per token.
pub fn add_bias() -> String {
    elementwise(
        "width: u32, p0: u32, p1: u32, p2: u32",
        &[("y", "read_write"), ("b", "read")],
        "step.n_tok * p.width",
        "    y[i] += b[i % p.width];",
    )
}

/// `logits = softcap(logits * scale)` over the logit rows; `cap == 0`: no soft-capping.
pub fn scale_logits() -> String {
    elementwise(
        "width: u32, scale: f32, cap: f32, p0: u32",
        &[("y", "read_write")],
        "step.n_out * p.width",
        r#"    var v = y[i] * p.scale;
    if (p.cap > 0.0) { v = p.cap * tanh_safe(v / p.cap); }
    y[i] = v;"#,
    )
}

/// `dst[r] = src[out_rows[r]]` for the logit rows (rows of `width` values).
pub fn gather_rows() -> String {
    with_common(
        r#"
struct P { width: u32, p0: u32, p1: u32, p2: u32 }
@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<storage, read> out_rows: array<u32>;
@group(0) @binding(3) var<uniform> p: P;
@group(0) @binding(4) var<uniform> step: Step;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>) {
    let i = gid_of(wg, nwg, li.x);
    if (i >= step.n_out * p.width) { return; }
    let r = i / p.width;
    dst[i] = src[out_rows[r] * p.width + i % p.width];
}
"#,
    )
}

/// Workgroups for `total` items of an element-wise kernel (`EW` per workgroup), as a 2-D grid
/// within the per-dimension limit.
pub fn grid(total: u32, max_dim: u32) -> (u32, u32) {
    let wgs = total.div_ceil(EW).max(1);
    if wgs <= max_dim {
        (wgs, 1)
    } else {
        (max_dim, wgs.div_ceil(max_dim))
    }
}

/// Workgroups for `rows` rows of a row kernel (one workgroup per row).
pub fn row_grid(rows: u32, max_dim: u32) -> (u32, u32) {
    let rows = rows.max(1);
    if rows <= max_dim {
        (rows, 1)
    } else {
        (max_dim, rows.div_ceil(max_dim))
    }
}
