#![doc = include_str!("../README.md")]

mod envelope;
mod keyring;

pub use envelope::{CryptoError, Purpose};
pub use keyring::{KeyId, Keyring, KeyringError};
