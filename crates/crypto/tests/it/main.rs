//! The crate's public behaviour: sealing and opening, what must not open, rotation, the
//! keyring's formats, and properties over arbitrary input.

mod envelope;
mod keyring;
mod properties;
mod rotation;

use countersign_crypto::{KeyId, Keyring};

/// A keyring of fresh random keys with these ids, the first active.
pub fn keyring(ids: &[&str]) -> Keyring {
    Keyring::parse(&entries(ids)).expect("generated entries parse")
}

/// Fresh random entries for these ids, comma-separated.
pub fn entries(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| Keyring::generate_entry(&key_id(id)))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn key_id(id: &str) -> KeyId {
    KeyId::parse(id).expect("valid key id")
}

/// The payload nonce and ciphertext of a version-1 envelope: everything after the version,
/// the key id, the wrap nonce and the wrapped key (see the layout in the crate docs).
pub fn payload_section(envelope: &[u8]) -> &[u8] {
    let id_len = usize::from(envelope[1]);
    &envelope[2 + id_len + 12 + 48..]
}
