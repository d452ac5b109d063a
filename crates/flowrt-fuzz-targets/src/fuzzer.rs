//! A small coverage-blind mutation fuzzer on stable Rust, for CI (`tests/ci_fuzz.rs`): no
//! nightly, no cargo-fuzz, no instrumentation. It runs every seed once unmodified, then for a
//! set time mutates seeds and earlier mutants (1-4 mutations each: bit flips, interesting
//! bytes, inserted, deleted and duplicated ranges, dictionary tokens from `fuzz/flowrt.dict`,
//! splices with other seeds, boundary values as little-endian u32/u64 and as decimal numbers)
//! and calls the target under [`std::panic::catch_unwind`]. Without coverage feedback it finds
//! far less than libFuzzer (`scripts/fuzz`); it catches what a few mutations away from a seed
//! breaks.
//!
//! A panic, or an input that runs past the target's time limit (a watchdog thread), is a
//! finding: the input is written to `target/ci-fuzz-findings/TARGET-<hash>`. A panic is
//! reported in [`Report::findings`]; a hang cannot be stopped in-process, so the watchdog
//! prints the path and replay instructions and exits the process with status 101.
//!
//! Runs are reproducible: the random generator (splitmix64, below) starts from
//! `FLOWRT_CI_FUZZ_SEED` (default 1) mixed with the target's name, and the mutants depend on
//! nothing else, so a run with the same seed, corpus and dictionary makes the same inputs in
//! the same order (how many depends on the time).

use std::collections::HashSet;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use crate::seeds::{self, Seed};

/// Seconds per target ([`Config::from_env`]; default [`DEFAULT_SECS`]).
pub const SECS_ENV: &str = "FLOWRT_CI_FUZZ_SECS";
/// The random generator's seed ([`Config::from_env`]; default [`DEFAULT_SEED`]).
pub const SEED_ENV: &str = "FLOWRT_CI_FUZZ_SEED";
/// A file to replay through the target instead of fuzzing (`tests/ci_fuzz.rs`).
pub const REPLAY_ENV: &str = "FLOWRT_CI_FUZZ_REPLAY";
/// Default seconds per target: five targets, about 60 s in all.
pub const DEFAULT_SECS: f64 = 12.0;
/// Default random seed.
pub const DEFAULT_SEED: u64 = 1;

/// Distinct findings after which a run stops early.
const MAX_FINDINGS: usize = 8;
/// Earlier mutants kept to mutate again: at most this many, and this many bytes.
const POOL_LEN: usize = 256;
const POOL_BYTES: usize = 16 << 20;

/// One fuzz target: its function, and the bounds `scripts/fuzz` gives libFuzzer for it.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Longest mutant (libFuzzer's `-max_len`); seeds run whole.
    pub max_len: usize,
    /// An input running longer is a finding (libFuzzer's `-timeout`).
    pub timeout: Duration,
}

/// Every target, with `scripts/fuzz`'s `max_len` and `timeout_s`.
pub const TARGETS: [Target; 5] = [
    Target {
        name: "gguf_model",
        run: crate::gguf_model,
        max_len: 1 << 20,
        timeout: Duration::from_secs(10),
    },
    Target {
        name: "hf_dir",
        run: crate::hf_dir,
        max_len: 1 << 20,
        timeout: Duration::from_secs(10),
    },
    Target {
        name: "tokenizer",
        run: crate::tokenizer,
        max_len: 128 << 10,
        timeout: Duration::from_secs(10),
    },
    Target {
        name: "chat_template",
        run: crate::chat_template,
        max_len: 64 << 10,
        // Two renders, each allowed flowrt_text::RENDER_TIME_LIMIT (5 s).
        timeout: Duration::from_secs(15),
    },
    Target {
        name: "http_body",
        run: crate::http_body,
        max_len: 16 << 10,
        timeout: Duration::from_secs(10),
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The repository's root (this crate is `crates/flowrt-fuzz-targets`).
pub fn repo_root() -> PathBuf {
    let p = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// How long, from which random seed, and where findings go.
pub struct Config {
    pub secs: f64,
    pub seed: u64,
    pub repo: PathBuf,
    pub findings_dir: PathBuf,
}

impl Config {
    /// From `FLOWRT_CI_FUZZ_SECS` and `FLOWRT_CI_FUZZ_SEED` (decimal or `0x` hex); findings
    /// under the repository's `target/ci-fuzz-findings`.
    pub fn from_env() -> Result<Config, String> {
        let secs = match std::env::var(SECS_ENV) {
            Ok(s) => s
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{SECS_ENV}={s:?}: not a number of seconds"))?,
            Err(_) => DEFAULT_SECS,
        };
        let seed = match std::env::var(SEED_ENV) {
            Ok(s) => {
                let t = s.trim();
                let parsed = match t.strip_prefix("0x") {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => t.parse::<u64>(),
                };
                parsed.map_err(|_| format!("{SEED_ENV}={s:?}: not a u64"))?
            }
            Err(_) => DEFAULT_SEED,
        };
        let repo = repo_root();
        let findings_dir = repo.join("target/ci-fuzz-findings");
        Ok(Config {
            secs,
            seed,
            repo,
            findings_dir,
        })
    }
}

/// A panic the fuzzer found (hangs end the process instead; see the module's doc).
#[derive(Debug, Clone)]
pub struct Finding {
    pub message: String,
    pub path: PathBuf,
    /// Which execution found it (1-based), and when, in seconds from the start.
    pub exec: u64,
    pub secs: f64,
    /// The seed's name when the unmodified seed panicked.
    pub seed_name: Option<String>,
}

/// What one run did.
#[derive(Debug)]
pub struct Report {
    pub target: &'static str,
    pub rng_seed: u64,
    pub secs: f64,
    /// Of which running the seeds unmodified took.
    pub seed_secs: f64,
    pub execs: u64,
    pub generated_seeds: usize,
    pub committed_seeds: usize,
    pub regression_inputs: usize,
    pub dict_tokens: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn seeds(&self) -> usize {
        self.generated_seeds + self.committed_seeds + self.regression_inputs
    }

    /// One line: seconds, executions, executions per second, seeds, findings.
    pub fn summary(&self) -> String {
        format!(
            "{}: {:.1} s ({:.1} s of them the seeds, unmodified), {} execs, {:.0} exec/s, \
             seeds {} ({} generated, {} committed, {} regression), dictionary {} tokens, \
             findings {} ({SEED_ENV}={})",
            self.target,
            self.secs,
            self.seed_secs,
            self.execs,
            self.execs as f64 / self.secs.max(1e-9),
            self.seeds(),
            self.generated_seeds,
            self.committed_seeds,
            self.regression_inputs,
            self.dict_tokens,
            self.findings.len(),
            self.rng_seed,
        )
    }

    /// What a failing test says: each finding, its file and how to replay it.
    pub fn failure_message(&self) -> String {
        let mut s = format!(
            "fuzz target {}: {} finding(s) in {:.1} s ({} execs, {SEED_ENV}={})\n",
            self.target,
            self.findings.len(),
            self.secs,
            self.execs,
            self.rng_seed
        );
        for f in &self.findings {
            let how = match &f.seed_name {
                Some(n) => format!("the unmodified seed {n}"),
                None => format!("execution {} at {:.2} s", f.exec, f.secs),
            };
            s += &format!(
                "- {}: panic: {}\n  input: {} ({how})\n",
                self.target,
                f.message,
                f.path.display()
            );
        }
        if let Some(f) = self.findings.first() {
            s += &replay_instructions(self.target, &f.path, self.rng_seed);
        }
        s
    }
}

fn replay_instructions(target: &str, path: &Path, seed: u64) -> String {
    format!(
        "replay: {REPLAY_ENV}={p} cargo test --profile ci -p flowrt-fuzz-targets --test ci_fuzz -- {target} --exact\n\
         or with libFuzzer, after scripts/fuzz's build: fuzz/target/*/release/{target} {p}\n\
         rerun this fuzzing: {SEED_ENV}={seed} cargo test --profile ci -p flowrt-fuzz-targets --test ci_fuzz -- {target} --exact\n",
        p = path.display()
    )
}

/// Runs the file at `path` through `target` once, not catching a panic (for replaying a
/// finding with a backtrace). A relative path not found from the current directory (a test
/// runs in its crate's) is taken from the repository's root.
pub fn replay(target: &Target, path: &Path) {
    let joined;
    let path = if path.is_relative() && !path.exists() {
        joined = repo_root().join(path);
        &joined
    } else {
        path
    };
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!(
        "replaying {} ({} bytes) through {}",
        path.display(),
        data.len(),
        target.name
    );
    (target.run)(&data);
}

/// The seeds: made from the fixtures ([`seeds::generate_for`]), the committed
/// `fuzz/seeds/TARGET/*`, and the regression inputs `tests/fixtures/fuzz/TARGET-*` (and
/// `tests/fixtures/fuzz/TARGET/*`). Returns (generated, committed, regression).
pub fn corpus(repo: &Path, target: &str) -> (Vec<Seed>, Vec<Seed>, Vec<Seed>) {
    let generated = seeds::generate_for(repo, target);
    let committed = read_dir_files(&repo.join("fuzz/seeds").join(target), |_| true);
    let fixtures = repo.join("tests/fixtures/fuzz");
    let prefix = format!("{target}-");
    let mut regression = read_dir_files(&fixtures, |n| n.starts_with(&prefix));
    regression.extend(read_dir_files(&fixtures.join(target), |_| true));
    (generated, committed, regression)
}

fn read_dir_files(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<Seed> {
    let mut v: Vec<Seed> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_file())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !keep(&name) {
                return None;
            }
            let rel = e
                .path()
                .strip_prefix(repo_root())
                .map(Path::to_path_buf)
                .unwrap_or(e.path());
            Some((rel.display().to_string(), std::fs::read(e.path()).ok()?))
        })
        .collect();
    v.sort();
    v
}

/// The tokens of a libFuzzer dictionary: one per line, `"..."` with `\\`, `\"` and `\xNN`
/// escapes, optionally after `name=`; `#` comments and blank lines skipped.
pub fn parse_dict(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("dictionary line {}: {why}: {line}", i + 1);
        let start = l.find('"').ok_or_else(|| bad("no opening quote"))?;
        let (name, rest) = (&l[..start], &l[start + 1..]);
        if !name.is_empty() && !name.trim_end().ends_with('=') {
            return Err(bad("text before the token is not `name=`"));
        }
        let end = rest.rfind('"').ok_or_else(|| bad("no closing quote"))?;
        if !rest[end + 1..].trim().is_empty() {
            return Err(bad("text after the closing quote"));
        }
        let body = &rest.as_bytes()[..end];
        let mut tok = Vec::new();
        let mut j = 0;
        while j < body.len() {
            if body[j] != b'\\' {
                tok.push(body[j]);
                j += 1;
                continue;
            }
            match body.get(j + 1) {
                Some(b'\\') | Some(b'"') => {
                    tok.push(body[j + 1]);
                    j += 2;
                }
                Some(b'x') => {
                    let hex = body
                        .get(j + 2..j + 4)
                        .and_then(|h| std::str::from_utf8(h).ok())
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                        .ok_or_else(|| bad("bad \\x escape"))?;
                    tok.push(hex);
                    j += 4;
                }
                _ => return Err(bad("unknown escape")),
            }
        }
        if tok.is_empty() {
            return Err(bad("empty token"));
        }
        out.push(tok);
    }
    Ok(out)
}

/// splitmix64: small, fast, and good enough to pick mutations.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

/// FNV-1a, 64 bits: names a finding's file, and mixes the target's name into the seed.
pub fn fnv64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const BYTES: [u8; 10] = [0, 0xff, 0x7f, 0x80, 1, 0xfe, b' ', b'"', b'{', b'}'];
const U32S: [u32; 12] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fffe,
    0xffff_ffff,
];
const U64S: [u64; 10] = [
    0,
    1,
    0xffff_ffff,
    0x1_0000_0000,
    1 << 40,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX - 1,
    u64::MAX,
    0x0000_0100_0000_0000,
];
const NUMBERS: [&str; 12] = [
    "0",
    "-1",
    "1",
    "255",
    "65536",
    "2147483648",
    "4294967296",
    "-9223372036854775809",
    "18446744073709551616",
    "1e308",
    "-0.0",
    "99999999999999999999999999",
];

/// Mutates inputs: holds the seeds (for splicing) and the dictionary.
pub struct Mutator<'a> {
    pub seeds: &'a [Arc<Vec<u8>>],
    pub dict: &'a [Vec<u8>],
}

impl Mutator<'_> {
    /// An offset in `0..=data.len()`: anywhere, near the start (headers), or just after a
    /// part separator (the start of one of the input's files).
    fn offset(&self, rng: &mut Rng, data: &[u8], parts: &[usize]) -> usize {
        let n = data.len();
        let p = match rng.below(3) {
            0 => rng.below(n + 1),
            1 => rng.below(n.min(512) + 1),
            _ => parts.get(rng.below(parts.len())).copied().unwrap_or(0) + rng.below(257),
        };
        p.min(n)
    }

    /// Applies one random mutation to `data`.
    pub fn mutate_once(&self, rng: &mut Rng, data: &mut Vec<u8>, parts: &[usize]) {
        let n = data.len();
        let p = self.offset(rng, data, parts);
        match rng.below(12) {
            // Flip a bit.
            0 if n > 0 => data[p.min(n - 1)] ^= 1 << rng.below(8),
            // An interesting or random byte.
            1 if n > 0 => {
                data[p.min(n - 1)] = if rng.chance(4) {
                    rng.next_u64() as u8
                } else {
                    BYTES[rng.below(BYTES.len())]
                }
            }
            // Insert random bytes, or one byte repeated.
            2 => {
                let max = if rng.chance(8) { 1024 } else { 16 };
                let len = 1 + rng.below(max);
                let bytes: Vec<u8> = if rng.chance(2) {
                    vec![BYTES[rng.below(BYTES.len())]; len]
                } else {
                    (0..len).map(|_| rng.next_u64() as u8).collect()
                };
                data.splice(p..p, bytes);
            }
            // Delete a range (sometimes a long one).
            3 if p < n => {
                let max = if rng.chance(8) {
                    n - p
                } else {
                    (n - p).min(64)
                };
                let len = 1 + rng.below(max);
                data.drain(p..p + len);
            }
            // Duplicate a range somewhere.
            4 if n > 0 => {
                let a = rng.below(n);
                let len = 1 + rng.below((n - a).min(256));
                let copy = data[a..a + len].to_vec();
                let times = if rng.chance(4) { 1 + rng.below(8) } else { 1 };
                for _ in 0..times {
                    data.splice(p..p, copy.iter().copied());
                }
            }
            // Overwrite with a dictionary token.
            5 | 6 if !self.dict.is_empty() => {
                let tok = &self.dict[rng.below(self.dict.len())];
                let end = (p + tok.len()).min(n);
                data.splice(p..end, tok.iter().copied());
            }
            // Insert a dictionary token.
            7 if !self.dict.is_empty() => {
                let tok = &self.dict[rng.below(self.dict.len())];
                data.splice(p..p, tok.iter().copied());
            }
            // Splice: our head, another seed's tail.
            8 if !self.seeds.is_empty() => {
                let other = &self.seeds[rng.below(self.seeds.len())];
                let q = rng.below(other.len() + 1);
                data.truncate(p);
                data.extend_from_slice(&other[q..]);
            }
            // A boundary value as a little-endian u32 or u64.
            9 => {
                let bytes = if rng.chance(2) {
                    let mut v = U32S[rng.below(U32S.len())];
                    if rng.chance(4) {
                        v = v.wrapping_add(rng.below(17) as u32).wrapping_sub(8);
                    }
                    v.to_le_bytes().to_vec()
                } else {
                    U64S[rng.below(U64S.len())].to_le_bytes().to_vec()
                };
                let end = (p + bytes.len()).min(n);
                data.splice(p..end, bytes);
            }
            // A decimal number replaced by a boundary value (JSON fields).
            10 => {
                let Some(d) = data[p..].iter().take(4096).position(u8::is_ascii_digit) else {
                    return;
                };
                let s = p + d;
                let e = s + data[s..].iter().take_while(|b| b.is_ascii_digit()).count();
                let num = NUMBERS[rng.below(NUMBERS.len())];
                data.splice(s..e, num.bytes());
            }
            // Truncate.
            _ => data.truncate(p),
        }
    }
}

/// Where each part of `data` (cut at [`crate::SEP`]) starts, the first at 0.
fn part_starts(data: &[u8]) -> Vec<usize> {
    let sep = crate::SEP;
    let mut v = vec![0];
    let mut i = 0;
    while let Some(d) = data[i..].iter().position(|&b| b == sep[0]) {
        let at = i + d;
        if data[at..].starts_with(sep) {
            v.push(at + sep.len());
            i = at + sep.len();
        } else {
            i = at + 1;
        }
    }
    v
}

thread_local! {
    /// Where the last panic on this thread happened (the panic hook's note).
    static LAST_PANIC_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// A panic hook that notes the panic's location for [`run`], then calls the previous hook.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let at = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            LAST_PANIC_AT.with(|c| *c.borrow_mut() = at);
            prev(info);
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

struct Running {
    started: Instant,
    input: Arc<Vec<u8>>,
}

fn write_finding(dir: &Path, target: &str, data: &[u8]) -> PathBuf {
    let path = dir.join(format!("{target}-{:016x}", fnv64(data)));
    let res = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, data));
    if let Err(e) = res {
        let _ = writeln!(
            std::io::stderr(),
            "ci-fuzz: cannot write the finding to {}: {e}",
            path.display()
        );
    }
    path
}

/// Starts a thread that ends the process when one input has run longer than the target's
/// limit, after saving the input and saying where; returns the flag that stops it.
fn watchdog(
    target: &'static Target,
    cfg: &Config,
    current: Arc<Mutex<Option<Running>>>,
) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let stop = done.clone();
    let dir = cfg.findings_dir.clone();
    let seed = cfg.seed;
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            let hung = {
                let cur = current.lock().unwrap_or_else(|e| e.into_inner());
                cur.as_ref()
                    .filter(|r| r.started.elapsed() > target.timeout)
                    .map(|r| (r.input.clone(), r.started.elapsed()))
            };
            if let Some((input, took)) = hung {
                let path = write_finding(&dir, target.name, &input);
                // Straight to the file descriptor: the test harness's capture of print
                // macros would lose it when the process exits.
                let _ = writeln!(
                    std::io::stderr(),
                    "\nci-fuzz: fuzz target {}: hang: one input has run {:.1} s (limit {} s); \
                     ending the test process.\n  input: {}\n{}",
                    target.name,
                    took.as_secs_f64(),
                    target.timeout.as_secs(),
                    path.display(),
                    replay_instructions(target.name, &path, seed)
                );
                std::process::exit(101);
            }
        }
    });
    done
}

/// Fuzzes `target` for `cfg.secs` seconds (after running every seed once unmodified, however
/// long that takes) and reports what it did. Panics are findings in the report; a hang ends
/// the process (see the module's doc).
pub fn run(target: &'static Target, cfg: &Config) -> Result<Report, String> {
    install_panic_hook();
    let dict_path = cfg.repo.join("fuzz/flowrt.dict");
    let dict_text =
        std::fs::read_to_string(&dict_path).map_err(|e| format!("{}: {e}", dict_path.display()))?;
    let dict = parse_dict(&dict_text).map_err(|e| format!("{}: {e}", dict_path.display()))?;
    let (generated, committed, regression) = corpus(&cfg.repo, target.name);
    let named: Vec<(String, Arc<Vec<u8>>)> = generated
        .iter()
        .chain(&committed)
        .chain(&regression)
        .map(|(n, b)| (n.clone(), Arc::new(b.clone())))
        .collect();
    if named.is_empty() {
        return Err(format!("fuzz target {}: no seeds", target.name));
    }
    let seeds: Vec<Arc<Vec<u8>>> = named.iter().map(|(_, b)| b.clone()).collect();
    let mut report = Report {
        target: target.name,
        rng_seed: cfg.seed,
        secs: 0.0,
        seed_secs: 0.0,
        execs: 0,
        generated_seeds: generated.len(),
        committed_seeds: committed.len(),
        regression_inputs: regression.len(),
        dict_tokens: dict.len(),
        findings: Vec::new(),
    };
    let current: Arc<Mutex<Option<Running>>> = Arc::new(Mutex::new(None));
    let stop = watchdog(target, cfg, current.clone());
    let start = Instant::now();
    let mut seen = HashSet::new();
    let mut exec = |input: &Arc<Vec<u8>>, seed_name: Option<&str>, report: &mut Report| -> bool {
        *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running {
            started: Instant::now(),
            input: input.clone(),
        });
        let res = catch_unwind(AssertUnwindSafe(|| (target.run)(input)));
        *current.lock().unwrap_or_else(|e| e.into_inner()) = None;
        report.execs += 1;
        let Err(payload) = res else {
            return true;
        };
        let at = LAST_PANIC_AT.with(|c| c.borrow_mut().take());
        let message = match &at {
            Some(at) => format!("{} (at {at})", panic_message(&*payload)),
            None => panic_message(&*payload),
        };
        // One finding per place that panics (or per message, without a place).
        if seen.insert(at.unwrap_or_else(|| message.clone())) {
            let path = write_finding(&cfg.findings_dir, target.name, input);
            report.findings.push(Finding {
                message,
                path,
                exec: report.execs,
                secs: start.elapsed().as_secs_f64(),
                seed_name: seed_name.map(str::to_string),
            });
        }
        false
    };
    for (name, input) in &named {
        exec(input, Some(name), &mut report);
    }
    report.seed_secs = start.elapsed().as_secs_f64();
    let mut rng = Rng::new(cfg.seed ^ fnv64(target.name.as_bytes()));
    let mutator = Mutator {
        seeds: &seeds,
        dict: &dict,
    };
    let mut pool: Vec<Arc<Vec<u8>>> = Vec::new();
    let mut pool_bytes = 0usize;
    let budget = Duration::from_secs_f64(cfg.secs);
    while start.elapsed() < budget && report.findings.len() < MAX_FINDINGS {
        let base = if !pool.is_empty() && rng.chance(2) {
            &pool[rng.below(pool.len())]
        } else {
            &seeds[rng.below(seeds.len())]
        };
        let mut data = base.to_vec();
        let parts = part_starts(&data);
        for _ in 0..1 + rng.below(4) {
            mutator.mutate_once(&mut rng, &mut data, &parts);
        }
        data.truncate(target.max_len);
        let input = Arc::new(data);
        if exec(&input, None, &mut report) {
            // Keep it to mutate further (coverage-blind: every mutant that passed).
            pool_bytes += input.len();
            if pool.len() < POOL_LEN {
                pool.push(input);
            } else {
                let i = rng.below(pool.len());
                pool_bytes -= pool[i].len();
                pool[i] = input;
            }
            while pool_bytes > POOL_BYTES && !pool.is_empty() {
                let i = rng.below(pool.len());
                pool_bytes -= pool.swap_remove(i).len();
            }
        }
    }
    report.secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_syntax() {
        let d = parse_dict("# c\n\n\"GGUF\"\nkw1=\"a\\x00\\xffb\"\n\"q\\\"\\\\\"\n").unwrap();
        assert_eq!(
            d,
            [b"GGUF".to_vec(), b"a\x00\xffb".to_vec(), b"q\"\\".to_vec()]
        );
        assert!(parse_dict("GGUF\n").is_err());
        assert!(parse_dict("\"\\x0\"\n").is_err());
    }

    #[test]
    fn the_committed_dictionary_parses() {
        let text = std::fs::read_to_string(repo_root().join("fuzz/flowrt.dict")).unwrap();
        let d = parse_dict(&text).unwrap();
        assert!(d.iter().any(|t| t == crate::SEP));
    }

    #[test]
    fn parts_start_after_each_separator() {
        let data = crate::join_parts(&[b"ab", b"", b"c"]);
        let n = crate::SEP.len();
        assert_eq!(part_starts(&data), [0, 2 + n, 2 + 2 * n]);
    }

    #[test]
    fn mutations_stay_in_bounds() {
        let seeds = vec![Arc::new(b"{\"a\": 12}".to_vec()), Arc::new(Vec::new())];
        let dict = vec![b"tok".to_vec()];
        let m = Mutator {
            seeds: &seeds,
            dict: &dict,
        };
        let mut rng = Rng::new(7);
        for i in 0..20_000 {
            let mut d = seeds[i % 2].to_vec();
            let parts = part_starts(&d);
            for _ in 0..4 {
                m.mutate_once(&mut rng, &mut d, &parts);
            }
        }
    }
}
