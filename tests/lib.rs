//! Black-box end-to-end tests of countersign: each test starts the real `countersign`
//! binaries as a user would and checks what they print and leave in PostgreSQL.
//!
//! This crate has no code of its own; it depends on the command-line crate so that
//! `cargo test` builds the binary before the tests run. It must never reach into a library
//! crate to fake a step the binary performs.

use std::path::PathBuf;

/// The path of a binary built from this workspace, next to the running test executable.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    // target/<profile>/deps/e2e-<hash> → target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built; `make test` builds it (`cargo build --workspace --bins`)",
        path.display()
    );
    path
}
