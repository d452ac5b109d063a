//! Downloading a catalog model from a Hugging Face repository over HTTPS.
//!
//! The bytes go to `models/<file_name>.part`; an interrupted download leaves that file, and
//! the next attempt asks for the rest with an HTTP `Range` request (a server that answers
//! with the whole file instead makes it start over). The finished file's size and SHA-256
//! are checked before it is renamed into place; a file with the wrong hash is deleted.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::hash::{write_sidecar, BUF_SIZE};
use crate::{CatalogEntry, HfFile, Progress, StoreError};

/// Where Hugging Face files are fetched from unless `FLOWRT_HF_ENDPOINT` says otherwise.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// How a download talks to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HfClient {
    /// e.g. `https://huggingface.co`.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` (gated repositories), from `HF_TOKEN`.
    pub token: Option<String>,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        // A stalled transfer fails after a minute without data; the next pull resumes.
        .timeout_per_read(Some(Duration::from_secs(60)))
        .user_agent(concat!("flowrt/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// `<models_dir>/<file_name>.part`, where an unfinished download waits to be resumed.
pub(crate) fn part_path(models_dir: &Path, entry: &CatalogEntry) -> PathBuf {
    models_dir.join(format!("{}.part", entry.file_name))
}

/// Downloads `file` (the source of `entry`) into `models_dir`, resuming a `.part` file
/// left by an earlier attempt, checks size and SHA-256 and installs it atomically.
pub(crate) fn download(
    client: &HfClient,
    entry: &CatalogEntry,
    file: &HfFile,
    models_dir: &Path,
    progress: &mut dyn Progress,
) -> Result<PathBuf, StoreError> {
    fs::create_dir_all(models_dir).map_err(StoreError::io("create directory", models_dir))?;
    let url = file.url(&client.endpoint);
    let part = part_path(models_dir, entry);
    let mut out = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&part)
        .map_err(StoreError::io("open", &part))?;
    // Two pulls of the same model must not write one .part file.
    out.try_lock().map_err(|_| StoreError::Http {
        url: url.clone(),
        detail: format!(
            "another flowrt is downloading it into {} (wait for it, or delete the file if \
             no pull is running)",
            part.display()
        ),
    })?;

    // The part already there, hashed, unless it cannot be part of this file.
    let mut have = out.metadata().map_err(StoreError::io("read", &part))?.len();
    if have > entry.size {
        have = 0;
    }
    let mut hasher = Sha256::new();
    if have > 0 {
        progress.message(&format!(
            "checking the {have} bytes already downloaded in {}",
            part.display()
        ));
        hash_prefix(&mut out, &part, have, &mut hasher)?;
    }
    truncate(&mut out, &part, have)?;

    let mut restarted = false;
    while have < entry.size {
        let agent = agent();
        let mut req = agent.get(&url);
        if let Some(token) = &client.token {
            req = req.header("Authorization", &format!("Bearer {token}"));
        }
        if have > 0 {
            req = req.header("Range", &format!("bytes={have}-"));
            progress.message(&format!(
                "resuming {} at {have} of {} bytes from {url}",
                entry.tag, entry.size
            ));
        } else {
            progress.message(&format!(
                "downloading {} ({:.1} MB) from {url}",
                entry.tag,
                entry.size as f64 / 1e6
            ));
        }
        let resp = req.call().map_err(|e| StoreError::Http {
            url: url.clone(),
            detail: e.to_string(),
        })?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let content_length = header("content-length").and_then(|v| v.parse::<u64>().ok());
        match status {
            206 if have > 0 => {
                let expected = format!("bytes {have}-");
                if !header("content-range").is_some_and(|r| r.starts_with(&expected)) {
                    return Err(StoreError::Http {
                        url,
                        detail: format!(
                            "asked for bytes {have}- and got Content-Range {:?}; delete {} \
                             to start over",
                            header("content-range").unwrap_or_default(),
                            part.display()
                        ),
                    });
                }
            }
            200 | 206 => {
                if have > 0 {
                    progress.message("the server sent the whole file; starting over");
                    have = 0;
                    hasher = Sha256::new();
                    truncate(&mut out, &part, 0)?;
                }
            }
            416 if have > 0 && !restarted => {
                // The server will not serve the rest: the part may be from another file.
                progress.message("the server refused to resume; starting over");
                restarted = true;
                have = 0;
                hasher = Sha256::new();
                truncate(&mut out, &part, 0)?;
                continue;
            }
            _ => return Err(StoreError::HttpStatus { url, status }),
        }
        if let Some(len) = content_length {
            if have + len != entry.size {
                return Err(StoreError::SizeMismatch {
                    what: format!("{url} (Content-Length {len} from byte {have})"),
                    expected: entry.size,
                    actual: have + len,
                });
            }
        }
        let mut body = resp.into_body().into_reader();
        let mut buf = vec![0u8; BUF_SIZE];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = out.sync_all();
                    return Err(StoreError::Http {
                        url,
                        detail: format!(
                            "transfer interrupted after {have} of {} bytes ({e}); run the \
                             pull again to resume from {}",
                            entry.size,
                            part.display()
                        ),
                    });
                }
            };
            if have + n as u64 > entry.size {
                return Err(StoreError::PartsTooLarge {
                    what: url,
                    limit: entry.size,
                    actual: have + n as u64,
                });
            }
            out.write_all(&buf[..n])
                .map_err(StoreError::io("write", &part))?;
            hasher.update(&buf[..n]);
            have += n as u64;
            progress.bytes(have, entry.size);
        }
        if have != entry.size {
            let _ = out.sync_all();
            return Err(StoreError::Http {
                url,
                detail: format!(
                    "the server closed the transfer after {have} of {} bytes; run the pull \
                     again to resume from {}",
                    entry.size,
                    part.display()
                ),
            });
        }
    }

    let actual = hex::encode(hasher.finalize());
    if !actual.eq_ignore_ascii_case(entry.sha256) {
        drop(out);
        // These bytes are wrong: resuming from them would never succeed.
        let _ = fs::remove_file(&part);
        return Err(StoreError::HashMismatch {
            what: url,
            expected: entry.sha256.into(),
            actual,
        });
    }
    out.sync_all().map_err(StoreError::io("flush", &part))?;
    crate::fetch::make_world_readable(&out, &part)?;
    let dest = models_dir.join(entry.file_name);
    fs::rename(&part, &dest).map_err(StoreError::io("move the downloaded model to", &dest))?;
    drop(out);
    write_sidecar(&dest, &actual);
    progress.message(&format!("installed {} at {}", entry.tag, dest.display()));
    Ok(dest)
}

/// Feeds the first `len` bytes of `file` to `hasher`.
fn hash_prefix(
    file: &mut File,
    path: &Path,
    len: u64,
    hasher: &mut Sha256,
) -> Result<(), StoreError> {
    file.seek(SeekFrom::Start(0))
        .map_err(StoreError::io("read", path))?;
    let mut left = len;
    let mut buf = vec![0u8; BUF_SIZE];
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        file.read_exact(&mut buf[..want])
            .map_err(StoreError::io("read", path))?;
        hasher.update(&buf[..want]);
        left -= want as u64;
    }
    Ok(())
}

/// Cuts `file` to `len` bytes and puts the write position at its end.
fn truncate(file: &mut File, path: &Path, len: u64) -> Result<(), StoreError> {
    file.set_len(len)
        .map_err(StoreError::io("truncate", path))?;
    file.seek(SeekFrom::Start(len))
        .map_err(StoreError::io("seek in", path))?;
    Ok(())
}
