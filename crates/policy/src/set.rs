//! The policies in force: loaded from files, re-read when a file changes.
//!
//! A file that does not load at start is an error for the caller (the service refuses to
//! start). A file that stops loading later keeps its last good version in force and the
//! refusal is returned to be logged: a broken edit never widens what is approved, and never
//! silently drops a policy an operator believes is on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use strum::VariantNames;

use crate::engine::{LoadError, Mode, Policy};

/// The policies loaded from a set of files, in the order given.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub policies: Vec<Arc<Policy>>,
}

impl Loaded {
    /// The policies whose outcomes take effect, in order.
    pub fn enforced(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.iter().filter(|p| p.mode == Mode::Enforce)
    }

    /// The policies only recorded.
    pub fn shadowed(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.iter().filter(|p| p.mode == Mode::Shadow)
    }
}

/// Why a file could not be (re)loaded.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum SourceError {
    #[error("{path}: {source}")]
    #[strum(serialize = "policy_unreadable")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Load { path: PathBuf, source: LoadError },
}

impl SourceError {
    pub fn code(&self) -> &'static str {
        match self {
            SourceError::Load { source, .. } => source.code(),
            other => other.into(),
        }
    }

    /// Every code a file may be refused with, each once: an unreadable file's, then
    /// [`LoadError`]'s.
    pub fn codes() -> Vec<&'static str> {
        let unreadable = SourceError::Read {
            path: PathBuf::new(),
            source: std::io::ErrorKind::NotFound.into(),
        };
        let mut codes = vec![unreadable.code()];
        for code in LoadError::VARIANTS {
            if !codes.contains(code) {
                codes.push(code);
            }
        }
        codes
    }
}

#[derive(Debug)]
struct Entry {
    path: PathBuf,
    modified: Option<SystemTime>,
    policy: Option<Arc<Policy>>,
}

/// Policy files, re-read when their modification time changes.
#[derive(Debug, Clone, Default)]
pub struct PolicySource {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl PolicySource {
    /// Loads every file of `paths`; the first that does not load refuses them all.
    pub fn open(paths: &[PathBuf]) -> Result<PolicySource, SourceError> {
        let mut entries = Vec::with_capacity(paths.len());
        for path in paths {
            let modified = modified(path);
            let policy = read(path)?;
            entries.push(Entry {
                path: path.clone(),
                modified,
                policy: Some(Arc::new(policy)),
            });
        }
        Ok(PolicySource {
            entries: Arc::new(Mutex::new(entries)),
        })
    }

    /// The policies in force, each file re-read first if it changed since it was last read;
    /// with the refusals of files that changed and no longer load (their last good version
    /// stays in force).
    pub fn current(&self) -> (Loaded, Vec<SourceError>) {
        let mut refusals = Vec::new();
        let mut entries = match self.entries.lock() {
            Ok(entries) => entries,
            Err(poisoned) => poisoned.into_inner(),
        };
        for entry in entries.iter_mut() {
            let now = modified(&entry.path);
            if now == entry.modified {
                continue;
            }
            entry.modified = now;
            match read(&entry.path) {
                Ok(policy) => entry.policy = Some(Arc::new(policy)),
                Err(e) => refusals.push(e),
            }
        }
        let policies = entries.iter().filter_map(|e| e.policy.clone()).collect();
        (Loaded { policies }, refusals)
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads and loads one file.
pub fn read(path: &Path) -> Result<Policy, SourceError> {
    let text = std::fs::read_to_string(path).map_err(|source| SourceError::Read {
        path: path.to_owned(),
        source,
    })?;
    Policy::load(&text).map_err(|source| SourceError::Load {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_error_has_the_code_it_always_had() {
        let errors = [
            (
                SourceError::Read {
                    path: PathBuf::from("a.cedar"),
                    source: std::io::ErrorKind::PermissionDenied.into(),
                },
                "policy_unreadable",
            ),
            (
                SourceError::Load {
                    path: PathBuf::from("a.cedar"),
                    source: LoadError::Empty,
                },
                "policy_empty",
            ),
            (
                SourceError::Load {
                    path: PathBuf::from("a.cedar"),
                    source: LoadError::BadHeader {
                        line: 1,
                        key: "mode",
                    },
                },
                "policy_header",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
        assert_eq!(
            SourceError::codes(),
            [
                "policy_unreadable",
                "policy_header",
                "policy_syntax",
                "policy_invalid",
                "policy_empty",
            ]
        );
    }
}
