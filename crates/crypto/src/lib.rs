//! Encryption at rest for countersign.
//!
//! Suspended run state, queued requests, content-bearing event payloads, journal entries and
//! comments are stored as *envelopes*: each value sealed with AES-256-GCM under its own fresh
//! data key, the data key sealed under a master key from the [`Keyring`], and both bound to
//! what the value is for ([`Purpose`]) and which run it belongs to. A ciphertext copied to
//! another column or another run does not open. The keyring holds several master keys so
//! they can be rotated: the first seals, all open, and [`Keyring::reseal`] moves an envelope
//! to the active key without touching its payload.
//!
//! This crate must never:
//!
//! - log, persist, format or return key material or plaintext in an error or a `Debug`
//!   output: errors name key ids and byte counts, nothing else;
//! - panic on its input: every envelope, however truncated or tampered, and every keyring
//!   spec, however malformed, yields an error (an unreadable envelope is always
//!   `state_unreadable`, never a silent empty value);
//! - do I/O beyond reading the key file it is pointed at and the operating system's random
//!   source.

mod envelope;
mod keyring;

pub use envelope::{CryptoError, Purpose};
pub use keyring::{KeyId, Keyring, KeyringError};
