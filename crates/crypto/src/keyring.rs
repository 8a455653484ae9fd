//! The keyring: the master keys, named by key ids, in the order an operator wrote them.
//!
//! Why an ordered list and not a single key: rotation has to be possible without downtime
//! and without a flag day. The first key seals every new value; every key opens. An operator
//! rotates by putting a new key first, re-sealing the stored envelopes (only their data keys
//! are re-wrapped, see [`Keyring::reseal`]), and then dropping the old key.
//!
//! Why errors carry entry numbers and key ids but never the text of an entry: a misplaced
//! separator can put key material where an id was expected, and errors end up in logs.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::OsRng;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use secrecy::{ExposeSecret, SecretBox};
use zeroize::Zeroizing;

/// Length of a master key and of a data key: AES-256.
pub(crate) const KEY_LEN: usize = 32;
/// Longest key id; the envelope stores its length in one byte.
pub(crate) const KEY_ID_MAX_LEN: usize = 32;

/// Why a keyring could not be loaded. Messages name entries by their 1-based position and
/// key ids, never the text of an entry, so they never contain key material.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum KeyringError {
    #[error("no keyring configured: neither keys nor a key file given")]
    #[strum(serialize = "keyring_not_configured")]
    NotConfigured,
    #[error("could not read the key file {}", path.display())]
    #[strum(serialize = "keyring_file_unreadable")]
    FileUnreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the keyring holds no keys")]
    #[strum(serialize = "keyring_empty")]
    Empty,
    #[error("key id must be 1 to 32 characters from A-Z, a-z, 0-9, '_' and '-'")]
    InvalidKeyId,
    #[error(
        "keyring entry {entry} is not of the form id:BASE64KEY \
         (an id of 1 to 32 characters from A-Z, a-z, 0-9, '_' and '-')"
    )]
    #[strum(serialize = "keyring_malformed_entry")]
    MalformedEntry { entry: usize },
    #[error("keyring entry {entry} (key id {key_id}): the key is not standard padded base64")]
    #[strum(serialize = "keyring_invalid_base64")]
    InvalidBase64 { entry: usize, key_id: KeyId },
    #[error("keyring entry {entry} (key id {key_id}): the key is {length} bytes, expected 32")]
    #[strum(serialize = "keyring_wrong_key_length")]
    WrongKeyLength {
        entry: usize,
        key_id: KeyId,
        length: usize,
    },
    #[error("keyring entry {entry}: key id {key_id} appears more than once")]
    #[strum(serialize = "keyring_duplicate_key_id")]
    DuplicateKeyId { entry: usize, key_id: KeyId },
}

impl KeyringError {
    /// The stable code of this error.
    pub fn code(&self) -> &'static str {
        self.into()
    }
}

/// The name of a master key: 1 to 32 characters from `A-Z`, `a-z`, `0-9`, `_` and `-`.
///
/// Stored in every envelope's header, so it must stay short and must never be a secret.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(String);

impl KeyId {
    /// Accepts 1 to 32 characters from `A-Z`, `a-z`, `0-9`, `_` and `-`.
    pub fn parse(s: &str) -> Result<KeyId, KeyringError> {
        let valid_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if !s.is_empty() && s.len() <= KEY_ID_MAX_LEN && s.chars().all(valid_char) {
            Ok(KeyId(s.to_owned()))
        } else {
            Err(KeyringError::InvalidKeyId)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for KeyId {
    type Err = KeyringError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyId::parse(s)
    }
}

/// A master key and its id. The key bytes live in a [`SecretBox`]: wiped on drop, and
/// redacted by its `Debug`.
pub(crate) struct MasterKey {
    pub(crate) id: KeyId,
    secret: SecretBox<[u8; KEY_LEN]>,
}

impl MasterKey {
    pub(crate) fn bytes(&self) -> &[u8; KEY_LEN] {
        self.secret.expose_secret()
    }
}

impl Clone for MasterKey {
    fn clone(&self) -> Self {
        MasterKey {
            id: self.id.clone(),
            secret: SecretBox::init_with_mut(|k: &mut [u8; KEY_LEN]| {
                k.copy_from_slice(self.secret.expose_secret())
            }),
        }
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Ordered `(key id, master key)` pairs: the first seals, all open.
///
/// Its `Debug` lists the key ids only.
#[derive(Clone)]
pub struct Keyring {
    /// The key that seals. Held apart from the others so that a keyring can never be empty.
    active: MasterKey,
    /// The keys that only open, in the order they were given.
    others: Vec<MasterKey>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("key_ids", &self.key_ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Keyring {
    /// Parses `id1:BASE64KEY,id2:BASE64KEY`: entries separated by commas and/or whitespace
    /// (newlines included), each key 32 bytes in standard padded base64. Lines whose first
    /// non-blank character is `#` are comments, so a key file has the same format with one
    /// entry per line. The first entry is the active key. Rejects an empty keyring, a
    /// duplicate id, bad base64 and a key of the wrong length.
    pub fn parse(spec: &str) -> Result<Keyring, KeyringError> {
        let tokens = spec
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with('#'))
            .flat_map(|line| line.split(|c: char| c == ',' || c.is_whitespace()))
            .filter(|token| !token.is_empty());

        let mut keys: Vec<MasterKey> = Vec::new();
        for (index, token) in tokens.enumerate() {
            let entry = index + 1;
            let (id, encoded) = token
                .split_once(':')
                .ok_or(KeyringError::MalformedEntry { entry })?;
            let id = KeyId::parse(id).map_err(|_| KeyringError::MalformedEntry { entry })?;
            if keys.iter().any(|key| key.id == id) {
                return Err(KeyringError::DuplicateKeyId { entry, key_id: id });
            }
            let secret = decode_key(encoded, entry, &id)?;
            keys.push(MasterKey { id, secret });
        }

        let mut keys = keys.into_iter();
        let active = keys.next().ok_or(KeyringError::Empty)?;
        Ok(Keyring {
            active,
            others: keys.collect(),
        })
    }

    /// Reads a key file: the [`Keyring::parse`] format, typically one entry per line.
    pub fn from_file(path: &Path) -> Result<Keyring, KeyringError> {
        let contents = Zeroizing::new(std::fs::read_to_string(path).map_err(|source| {
            KeyringError::FileUnreadable {
                path: path.to_owned(),
                source,
            }
        })?);
        Keyring::parse(&contents)
    }

    /// The keyring a process is configured with: the spec `keys` ([`Keyring::parse`]) or,
    /// when that is absent or empty, the key file `file`. Neither given is
    /// [`KeyringError::NotConfigured`]: countersign does not run without keys.
    pub fn load(keys: Option<&str>, file: Option<&Path>) -> Result<Keyring, KeyringError> {
        if let Some(spec) = keys.filter(|spec| !spec.is_empty()) {
            return Keyring::parse(spec);
        }
        match file.filter(|path| !path.as_os_str().is_empty()) {
            Some(path) => Keyring::from_file(path),
            None => Err(KeyringError::NotConfigured),
        }
    }

    /// A new keyring entry, `id:BASE64`, holding 32 fresh bytes from the operating system's
    /// random source.
    ///
    /// # Panics
    ///
    /// If the operating system's random source fails; there is no safe key to return then.
    pub fn generate_entry(id: &KeyId) -> String {
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        OsRng.fill_bytes(key.as_mut_slice());
        format!("{id}:{}", STANDARD.encode(key.as_slice()))
    }

    /// A keyring of one fresh random key, id `ephemeral`, that exists only in this process:
    /// for a process that seals nothing it must open again later (the reaper, a throwaway
    /// demo or benchmark database).
    ///
    /// # Panics
    ///
    /// If the operating system's random source fails, as [`Keyring::generate_entry`].
    pub fn ephemeral() -> Keyring {
        let id = KeyId::parse("ephemeral").expect("a valid key id");
        Keyring::parse(&Keyring::generate_entry(&id)).expect("a generated entry parses")
    }

    /// The id of the key that seals.
    pub fn active_key_id(&self) -> &KeyId {
        &self.active.id
    }

    /// Every key id, the active one first, then the others in the order they were given.
    pub fn key_ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys().map(|key| &key.id)
    }

    pub(crate) fn active(&self) -> &MasterKey {
        &self.active
    }

    pub(crate) fn get(&self, id: &KeyId) -> Option<&MasterKey> {
        self.keys().find(|key| key.id == *id)
    }

    fn keys(&self) -> impl Iterator<Item = &MasterKey> {
        std::iter::once(&self.active).chain(&self.others)
    }
}

fn decode_key(
    encoded: &str,
    entry: usize,
    id: &KeyId,
) -> Result<SecretBox<[u8; KEY_LEN]>, KeyringError> {
    // The decoder's own error names the offending character and offset; drop it.
    let bytes =
        Zeroizing::new(
            STANDARD
                .decode(encoded)
                .map_err(|_| KeyringError::InvalidBase64 {
                    entry,
                    key_id: id.clone(),
                })?,
        );
    if bytes.len() != KEY_LEN {
        return Err(KeyringError::WrongKeyLength {
            entry,
            key_id: id.clone(),
            length: bytes.len(),
        });
    }
    Ok(SecretBox::init_with_mut(|key: &mut [u8; KEY_LEN]| {
        key.copy_from_slice(&bytes)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const KEY_B: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

    fn id(s: &str) -> KeyId {
        KeyId::parse(s).expect("valid key id")
    }

    #[test]
    fn key_ids_accept_the_documented_alphabet_up_to_32_characters() {
        assert_eq!(id("k-2025_01").as_str(), "k-2025_01");
        assert_eq!(id(&"a".repeat(32)).to_string(), "a".repeat(32));
        for bad in ["", "has space", "colon:", "dot.", "é", &"a".repeat(33)] {
            assert!(
                matches!(KeyId::parse(bad), Err(KeyringError::InvalidKeyId)),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn the_first_entry_is_active_and_all_ids_are_listed_in_order() {
        let ring = Keyring::parse(&format!("new:{KEY_B},old:{KEY_A}")).expect("parses");
        assert_eq!(ring.active_key_id(), &id("new"));
        let ids: Vec<_> = ring.key_ids().map(KeyId::as_str).collect();
        assert_eq!(ids, ["new", "old"]);
        assert_eq!(ring.get(&id("old")).expect("old").bytes()[0], 0);
        assert_eq!(ring.get(&id("new")).expect("new").bytes()[0], 0x20);
        assert!(ring.get(&id("gone")).is_none());
    }

    #[test]
    fn a_key_file_with_comments_blank_lines_and_crlf_parses() {
        let file = format!(
            "# active key first\r\n\n  new:{KEY_B}\r\n   # retired soon\nold:{KEY_A}  \n\n"
        );
        let ring = Keyring::parse(&file).expect("parses");
        let ids: Vec<_> = ring.key_ids().map(KeyId::as_str).collect();
        assert_eq!(ids, ["new", "old"]);
    }

    #[test]
    fn entries_may_be_separated_by_commas_and_whitespace_together() {
        let ring = Keyring::parse(&format!(" a:{KEY_A} ,\n b:{KEY_B},, ")).expect("parses");
        assert_eq!(ring.key_ids().count(), 2);
    }

    #[test]
    fn an_empty_or_comment_only_spec_is_rejected_as_empty() {
        for spec in ["", "  \n ,, \n", "# nothing here\n"] {
            assert!(
                matches!(Keyring::parse(spec), Err(KeyringError::Empty)),
                "{spec:?}"
            );
        }
    }

    #[test]
    fn a_duplicate_id_is_rejected_with_its_entry_number() {
        let err = Keyring::parse(&format!("a:{KEY_A},b:{KEY_B},a:{KEY_B}")).unwrap_err();
        assert!(
            matches!(&err, KeyringError::DuplicateKeyId { entry: 3, key_id } if key_id.as_str() == "a"),
            "{err:?}"
        );
        assert_eq!(err.code(), "keyring_duplicate_key_id");
    }

    #[test]
    fn bad_base64_is_rejected_without_echoing_the_key() {
        let bad = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh*=";
        let err = Keyring::parse(&format!("a:{bad}")).unwrap_err();
        assert!(
            matches!(err, KeyringError::InvalidBase64 { entry: 1, .. }),
            "{err:?}"
        );
        assert_eq!(err.code(), "keyring_invalid_base64");
        assert!(!err.to_string().contains(bad));
        assert!(!format!("{err:?}").contains(bad));
    }

    #[test]
    fn unpadded_base64_is_rejected() {
        let unpadded = KEY_A.trim_end_matches('=');
        let err = Keyring::parse(&format!("a:{unpadded}")).unwrap_err();
        assert!(matches!(err, KeyringError::InvalidBase64 { .. }), "{err:?}");
    }

    #[test]
    fn a_key_of_the_wrong_length_is_rejected_with_its_length() {
        let short = STANDARD.encode([7u8; 16]);
        let err = Keyring::parse(&format!("a:{KEY_A} b:{short}")).unwrap_err();
        assert!(
            matches!(
                err,
                KeyringError::WrongKeyLength {
                    entry: 2,
                    length: 16,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.code(), "keyring_wrong_key_length");
    }

    #[test]
    fn an_entry_without_an_id_is_malformed_and_the_message_omits_the_key() {
        for spec in [KEY_A.to_owned(), format!(":{KEY_A}"), format!("{KEY_A}:a")] {
            let err = Keyring::parse(&spec).unwrap_err();
            assert!(
                matches!(err, KeyringError::MalformedEntry { entry: 1 }),
                "{spec}: {err:?}"
            );
            assert_eq!(err.code(), "keyring_malformed_entry");
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains(KEY_A.trim_end_matches('=')), "{shown}");
        }
    }

    #[test]
    fn keys_win_over_the_key_file() {
        let ring = Keyring::load(
            Some(&format!("env:{KEY_A}")),
            Some(Path::new("/nonexistent/countersign-keys")),
        )
        .expect("loads from the spec");
        assert_eq!(ring.active_key_id().as_str(), "env");
    }

    #[test]
    fn empty_keys_fall_back_to_the_key_file() {
        let path =
            std::env::temp_dir().join(format!("countersign-crypto-keyfile-{}", std::process::id()));
        std::fs::write(&path, format!("# keys\nfile:{KEY_B}\n")).expect("write key file");
        let loaded = Keyring::load(Some(""), Some(&path));
        std::fs::remove_file(&path).expect("remove key file");
        assert_eq!(loaded.expect("loads").active_key_id().as_str(), "file");
    }

    #[test]
    fn a_missing_key_file_is_unreadable() {
        let err =
            Keyring::load(None, Some(Path::new("/nonexistent/countersign-keys"))).unwrap_err();
        assert!(
            matches!(err, KeyringError::FileUnreadable { .. }),
            "{err:?}"
        );
        assert_eq!(err.code(), "keyring_file_unreadable");
    }

    #[test]
    fn neither_given_is_not_configured() {
        let err = Keyring::load(None, None).unwrap_err();
        assert!(matches!(err, KeyringError::NotConfigured), "{err:?}");
        assert_eq!(err.code(), "keyring_not_configured");
    }

    #[test]
    fn generated_entries_parse_and_differ() {
        let first = Keyring::generate_entry(&id("fresh"));
        let second = Keyring::generate_entry(&id("fresh"));
        assert_ne!(first, second);
        assert!(first.starts_with("fresh:"));
        let ring = Keyring::parse(&first).expect("a generated entry parses");
        assert_eq!(ring.active_key_id().as_str(), "fresh");
    }

    #[test]
    fn a_cloned_keyring_holds_the_same_keys() {
        let ring = Keyring::parse(&format!("a:{KEY_A},b:{KEY_B}")).expect("parses");
        let clone = ring.clone();
        for id in ring.key_ids() {
            assert_eq!(
                ring.get(id).expect("key").bytes(),
                clone.get(id).expect("cloned key").bytes()
            );
        }
    }

    #[test]
    fn two_ephemeral_keyrings_hold_different_keys() {
        let (a, b) = (Keyring::ephemeral(), Keyring::ephemeral());
        assert_eq!(a.active_key_id().as_str(), "ephemeral");
        assert_ne!(
            a.get(a.active_key_id()).expect("key").bytes(),
            b.get(b.active_key_id()).expect("key").bytes()
        );
    }

    #[test]
    fn every_keyring_error_has_the_code_it_always_had() {
        let errors = [
            (KeyringError::NotConfigured, "keyring_not_configured"),
            (
                KeyringError::FileUnreadable {
                    path: PathBuf::from("keys"),
                    source: std::io::ErrorKind::NotFound.into(),
                },
                "keyring_file_unreadable",
            ),
            (KeyringError::Empty, "keyring_empty"),
            (KeyringError::InvalidKeyId, "invalid_key_id"),
            (
                KeyringError::MalformedEntry { entry: 1 },
                "keyring_malformed_entry",
            ),
            (
                KeyringError::InvalidBase64 {
                    entry: 1,
                    key_id: id("k1"),
                },
                "keyring_invalid_base64",
            ),
            (
                KeyringError::WrongKeyLength {
                    entry: 1,
                    key_id: id("k1"),
                    length: 16,
                },
                "keyring_wrong_key_length",
            ),
            (
                KeyringError::DuplicateKeyId {
                    entry: 2,
                    key_id: id("k1"),
                },
                "keyring_duplicate_key_id",
            ),
        ];
        for (error, code) in errors {
            assert_eq!(error.code(), code, "{error:?}");
        }
    }
}
