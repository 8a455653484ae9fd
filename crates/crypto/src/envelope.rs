//! Envelopes: how a value is sealed, opened and moved to a new master key.
//!
//! Each value gets its own fresh 256-bit *data key*. The value is sealed under the data key
//! with AES-256-GCM; the data key is sealed (*wrapped*) under a master key from the keyring,
//! also with AES-256-GCM. Every nonce is 96 random bits from the operating system. Why two
//! layers: rotating a master key then means re-wrapping 32 bytes per value, never
//! re-encrypting payloads, and a random data key per value keeps the number of messages under
//! any one (key, random nonce) pair at one, far from GCM's nonce-collision bound.
//!
//! Why associated data: a value is only meaningful in its place. The payload is sealed with
//! `countersign:<purpose>:<run_id>`, and the data key with
//! `countersign:<purpose>:<run_id>:<key_id>`, so an envelope moved to another column (another
//! [`Purpose`]), to another run, or relabelled with another key id does not open. The key id
//! is left out of the payload's associated data on purpose: that is what lets
//! [`Keyring::reseal`] keep the payload bytes as they are.
//!
//! # Layout (version 1)
//!
//! All lengths in bytes; `n` is the key id length, `m` the plaintext length.
//!
//! | offset    | length | field                                                        |
//! |-----------|--------|--------------------------------------------------------------|
//! | 0         | 1      | version, `0x01`                                              |
//! | 1         | 1      | `n`, the key id length, 1..=32                               |
//! | 2         | n      | key id, ASCII `[A-Za-z0-9_-]`                                |
//! | 2+n       | 12     | nonce of the wrapped data key                                |
//! | 14+n      | 48     | wrapped data key: 32 bytes of ciphertext, then the 16-byte tag |
//! | 62+n      | 12     | nonce of the payload                                         |
//! | 74+n      | m+16   | payload: m bytes of ciphertext, then the 16-byte tag         |
//!
//! The shortest valid envelope (empty plaintext, one-character key id) is 91 bytes.
//!
//! Parsing never indexes: it splits with checked lengths, so any truncation, an unknown
//! version or a malformed key id is an error before any cryptography runs, and any flipped
//! byte after the header fails authentication. Every such failure has the code
//! `state_unreadable`.

use std::fmt;

use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, AeadInPlace, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use countersign_core::{RunId, TerminationReason};
use zeroize::Zeroizing;

use crate::keyring::{KeyId, Keyring, MasterKey, KEY_ID_MAX_LEN, KEY_LEN};

/// The envelope format this crate writes and reads.
const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;
const WRAPPED_KEY_LEN: usize = KEY_LEN + TAG_LEN;

/// What a sealed value is for. Part of the associated data, so a value sealed for one
/// purpose does not open as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Purpose {
    /// Suspended run state.
    State,
    /// A queued run request.
    Request,
    /// A content-bearing event payload.
    Event,
    /// An execution journal entry.
    Journal,
    /// A decision's comment.
    Comment,
    /// The signing secret of a webhook endpoint (sealed under the endpoint's id).
    WebhookSecret,
}

impl Purpose {
    /// Every purpose, in declaration order.
    pub const ALL: [Purpose; 6] = [
        Purpose::State,
        Purpose::Request,
        Purpose::Event,
        Purpose::Journal,
        Purpose::Comment,
        Purpose::WebhookSecret,
    ];

    /// The name used in the associated data. Stable: changing one makes every stored value
    /// of that purpose unreadable.
    pub fn as_str(&self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a value could not be sealed or opened. Messages name key ids and version numbers,
/// never key material or plaintext.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[non_exhaustive]
pub enum CryptoError {
    #[error("envelope is truncated")]
    Truncated,
    #[error("envelope version {version} is not understood (this build reads version 1)")]
    UnknownVersion { version: u8 },
    #[error("envelope header does not hold a valid key id")]
    MalformedKeyId,
    #[error("envelope is sealed under key {key_id}, which is not in the keyring")]
    UnknownKey { key_id: KeyId },
    #[error("envelope does not authenticate under key {key_id} for this purpose and run")]
    Unauthentic { key_id: KeyId },
    #[error("the value is too large to seal")]
    #[strum(serialize = "seal_too_large")]
    TooLarge,
    #[error("the operating system's random source failed")]
    RandomUnavailable,
}

impl CryptoError {
    /// The stable code of this error. Every failure to open an envelope is
    /// `state_unreadable`: the caller treats the value as unreadable for that run, whatever
    /// the cause.
    pub fn code(&self) -> &'static str {
        match self {
            CryptoError::Truncated
            | CryptoError::UnknownVersion { .. }
            | CryptoError::MalformedKeyId
            | CryptoError::UnknownKey { .. }
            | CryptoError::Unauthentic { .. } => TerminationReason::StateUnreadable.as_str(),
            other => other.into(),
        }
    }
}

/// An envelope split into its fields, borrowing from the stored bytes.
struct Parsed<'a> {
    key_id: KeyId,
    wrap_nonce: &'a [u8; NONCE_LEN],
    wrapped_key: &'a [u8; WRAPPED_KEY_LEN],
    payload_nonce: &'a [u8; NONCE_LEN],
    payload: &'a [u8],
    /// The payload nonce and ciphertext together, exactly as stored: what `reseal` keeps.
    payload_section: &'a [u8],
}

impl Keyring {
    /// Seals `plaintext` for `purpose` and `run_id` under the active key.
    pub fn seal(
        &self,
        purpose: Purpose,
        run_id: RunId,
        plaintext: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        let master = self.active();
        let mut data_key = Zeroizing::new([0u8; KEY_LEN]);
        fill_random(data_key.as_mut_slice())?;
        let mut payload_nonce = [0u8; NONCE_LEN];
        fill_random(&mut payload_nonce)?;

        let payload = cipher(&data_key)
            .encrypt(
                Nonce::from_slice(&payload_nonce),
                Payload {
                    msg: plaintext,
                    aad: payload_ad(purpose, run_id).as_bytes(),
                },
            )
            // The only failure is a plaintext beyond GCM's limit of 2^36 - 32 bytes.
            .map_err(|_| CryptoError::TooLarge)?;

        let mut section = Vec::with_capacity(NONCE_LEN + payload.len());
        section.extend_from_slice(&payload_nonce);
        section.extend_from_slice(&payload);
        assemble(master, &data_key, purpose, run_id, &section)
    }

    /// Opens an envelope sealed for `purpose` and `run_id` under any key of the keyring.
    ///
    /// Every failure — truncation, an unknown version, a key not in the keyring, a wrong
    /// key, a tampered byte, another purpose or another run — is an error whose
    /// [`CryptoError::code`] is `state_unreadable`.
    pub fn open(
        &self,
        purpose: Purpose,
        run_id: RunId,
        envelope: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        let parsed = parse(envelope)?;
        let data_key = self.unwrap_data_key(&parsed, purpose, run_id)?;
        cipher(&data_key)
            .decrypt(
                Nonce::from_slice(parsed.payload_nonce),
                Payload {
                    msg: parsed.payload,
                    aad: payload_ad(purpose, run_id).as_bytes(),
                },
            )
            .map_err(|_| CryptoError::Unauthentic {
                key_id: parsed.key_id.clone(),
            })
    }

    /// Re-wraps only the data key under the active master key, leaving the payload
    /// ciphertext untouched.
    /// `Ok(None)` when the envelope is already sealed under the active key.
    ///
    /// An envelope that is re-wrapped is first opened in full (the plaintext is wiped right
    /// after), so a reseal that succeeds always yields an envelope that opens, and a rotation
    /// finds unreadable values while the old key still exists rather than after it is gone.
    /// An envelope already under the active key is only parsed, not authenticated, so
    /// running a rotation again over rows it already moved stays cheap.
    pub fn reseal(
        &self,
        purpose: Purpose,
        run_id: RunId,
        envelope: &[u8],
    ) -> Result<Option<Vec<u8>>, CryptoError> {
        let parsed = parse(envelope)?;
        let active = self.active();
        if parsed.key_id == active.id {
            return Ok(None);
        }
        let data_key = self.unwrap_data_key(&parsed, purpose, run_id)?;

        // Authenticate the payload in a buffer that is wiped on drop. The capacity is exact,
        // so decryption, which shrinks the buffer, never reallocates a copy of the plaintext.
        let mut plaintext = Zeroizing::new(Vec::with_capacity(parsed.payload.len()));
        plaintext.extend_from_slice(parsed.payload);
        cipher(&data_key)
            .decrypt_in_place(
                Nonce::from_slice(parsed.payload_nonce),
                payload_ad(purpose, run_id).as_bytes(),
                &mut *plaintext,
            )
            .map_err(|_| CryptoError::Unauthentic {
                key_id: parsed.key_id.clone(),
            })?;

        assemble(active, &data_key, purpose, run_id, parsed.payload_section).map(Some)
    }

    /// The id of the key an envelope is sealed under, read from its header alone; nothing
    /// is authenticated.
    pub fn envelope_key_id(envelope: &[u8]) -> Result<KeyId, CryptoError> {
        parse_header(envelope).map(|(key_id, _)| key_id)
    }

    fn unwrap_data_key(
        &self,
        parsed: &Parsed<'_>,
        purpose: Purpose,
        run_id: RunId,
    ) -> Result<Zeroizing<[u8; KEY_LEN]>, CryptoError> {
        let master = self
            .get(&parsed.key_id)
            .ok_or_else(|| CryptoError::UnknownKey {
                key_id: parsed.key_id.clone(),
            })?;
        let unauthentic = || CryptoError::Unauthentic {
            key_id: parsed.key_id.clone(),
        };

        // Decrypt in place in a wiped buffer of exact capacity, so the data key is never
        // left behind in freed memory.
        let mut buffer = Zeroizing::new(Vec::with_capacity(WRAPPED_KEY_LEN));
        buffer.extend_from_slice(parsed.wrapped_key);
        cipher(master.bytes())
            .decrypt_in_place(
                Nonce::from_slice(parsed.wrap_nonce),
                wrap_ad(purpose, run_id, &parsed.key_id).as_bytes(),
                &mut *buffer,
            )
            .map_err(|_| unauthentic())?;

        let mut data_key = Zeroizing::new([0u8; KEY_LEN]);
        if buffer.len() != KEY_LEN {
            return Err(unauthentic());
        }
        data_key.copy_from_slice(&buffer);
        Ok(data_key)
    }
}

/// The header and wrapped data key under `master`, followed by `payload_section` (payload
/// nonce and ciphertext) as given.
fn assemble(
    master: &MasterKey,
    data_key: &[u8; KEY_LEN],
    purpose: Purpose,
    run_id: RunId,
    payload_section: &[u8],
) -> Result<Vec<u8>, CryptoError> {
    let mut wrap_nonce = [0u8; NONCE_LEN];
    fill_random(&mut wrap_nonce)?;
    let wrapped_key = cipher(master.bytes())
        .encrypt(
            Nonce::from_slice(&wrap_nonce),
            Payload {
                msg: data_key.as_slice(),
                aad: wrap_ad(purpose, run_id, &master.id).as_bytes(),
            },
        )
        .map_err(|_| CryptoError::TooLarge)?;

    let id = master.id.as_str().as_bytes();
    // A parsed KeyId is at most 32 bytes, so its length always fits the one-byte field.
    let id_len = u8::try_from(id.len()).map_err(|_| CryptoError::MalformedKeyId)?;
    let mut envelope =
        Vec::with_capacity(2 + id.len() + NONCE_LEN + wrapped_key.len() + payload_section.len());
    envelope.push(VERSION);
    envelope.push(id_len);
    envelope.extend_from_slice(id);
    envelope.extend_from_slice(&wrap_nonce);
    envelope.extend_from_slice(&wrapped_key);
    envelope.extend_from_slice(payload_section);
    Ok(envelope)
}

/// Version, key id, and the bytes after them.
fn parse_header(envelope: &[u8]) -> Result<(KeyId, &[u8]), CryptoError> {
    let (&version, rest) = envelope.split_first().ok_or(CryptoError::Truncated)?;
    if version != VERSION {
        return Err(CryptoError::UnknownVersion { version });
    }
    let (&id_len, rest) = rest.split_first().ok_or(CryptoError::Truncated)?;
    let id_len = usize::from(id_len);
    if id_len == 0 || id_len > KEY_ID_MAX_LEN {
        return Err(CryptoError::MalformedKeyId);
    }
    let (id, rest) = rest
        .split_at_checked(id_len)
        .ok_or(CryptoError::Truncated)?;
    let key_id = std::str::from_utf8(id)
        .ok()
        .and_then(|id| KeyId::parse(id).ok())
        .ok_or(CryptoError::MalformedKeyId)?;
    Ok((key_id, rest))
}

fn parse(envelope: &[u8]) -> Result<Parsed<'_>, CryptoError> {
    let (key_id, rest) = parse_header(envelope)?;
    let (wrap_nonce, rest) = take::<NONCE_LEN>(rest)?;
    let (wrapped_key, payload_section) = take::<WRAPPED_KEY_LEN>(rest)?;
    let (payload_nonce, payload) = take::<NONCE_LEN>(payload_section)?;
    if payload.len() < TAG_LEN {
        return Err(CryptoError::Truncated);
    }
    Ok(Parsed {
        key_id,
        wrap_nonce,
        wrapped_key,
        payload_nonce,
        payload,
        payload_section,
    })
}

/// The first `N` bytes as an array, and the rest.
fn take<const N: usize>(input: &[u8]) -> Result<(&[u8; N], &[u8]), CryptoError> {
    let (head, rest) = input.split_at_checked(N).ok_or(CryptoError::Truncated)?;
    let head = <&[u8; N]>::try_from(head).map_err(|_| CryptoError::Truncated)?;
    Ok((head, rest))
}

fn payload_ad(purpose: Purpose, run_id: RunId) -> String {
    format!("countersign:{purpose}:{run_id}")
}

fn wrap_ad(purpose: Purpose, run_id: RunId, key_id: &KeyId) -> String {
    format!("countersign:{purpose}:{run_id}:{key_id}")
}

fn cipher(key: &[u8; KEY_LEN]) -> Aes256Gcm {
    Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(key))
}

fn fill_random(buffer: &mut [u8]) -> Result<(), CryptoError> {
    OsRng
        .try_fill_bytes(buffer)
        .map_err(|_| CryptoError::RandomUnavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(spec_ids: &[&str]) -> Keyring {
        let spec: Vec<String> = spec_ids
            .iter()
            .map(|id| Keyring::generate_entry(&KeyId::parse(id).expect("valid id")))
            .collect();
        Keyring::parse(&spec.join(",")).expect("parses")
    }

    #[test]
    fn a_sealed_envelope_has_the_documented_layout() {
        let keyring = ring(&["k-1"]);
        let plaintext = b"seven b";
        let envelope = keyring
            .seal(Purpose::State, RunId::new(), plaintext)
            .expect("seals");
        assert_eq!(envelope.first(), Some(&1), "version byte");
        assert_eq!(envelope.get(1), Some(&3), "key id length");
        assert_eq!(envelope.get(2..5), Some(&b"k-1"[..]), "key id");
        let n = 3;
        assert_eq!(envelope.len(), 74 + n + plaintext.len() + 16);
        let parsed = parse(&envelope).expect("parses");
        assert_eq!(parsed.wrapped_key.len(), 48);
        assert_eq!(parsed.payload.len(), plaintext.len() + 16);
        assert_eq!(parsed.payload_section.len(), 12 + plaintext.len() + 16);
        assert_eq!(envelope.get(62 + n..), Some(parsed.payload_section));
    }

    #[test]
    fn the_shortest_envelope_is_91_bytes_and_one_less_is_truncated() {
        let keyring = ring(&["k"]);
        let envelope = keyring
            .seal(Purpose::Comment, RunId::new(), b"")
            .expect("seals");
        assert_eq!(envelope.len(), 91);
        assert!(parse(&envelope).is_ok());
        assert_eq!(
            parse(envelope.get(..90).expect("prefix")).err(),
            Some(CryptoError::Truncated)
        );
    }

    #[test]
    fn a_header_with_a_zero_or_overlong_key_id_length_is_malformed() {
        for len in [0u8, 33, 255] {
            let mut envelope = vec![VERSION, len];
            envelope.extend_from_slice(&[b'a'; 300]);
            assert_eq!(
                Keyring::envelope_key_id(&envelope).err(),
                Some(CryptoError::MalformedKeyId),
                "length {len}"
            );
        }
    }

    #[test]
    fn a_header_whose_key_id_is_not_in_the_alphabet_is_malformed() {
        let envelope = [VERSION, 2, b'a', b':', 0, 0];
        assert_eq!(
            Keyring::envelope_key_id(&envelope).err(),
            Some(CryptoError::MalformedKeyId)
        );
        let not_utf8 = [VERSION, 2, 0xC3, 0x28];
        assert_eq!(
            Keyring::envelope_key_id(&not_utf8).err(),
            Some(CryptoError::MalformedKeyId)
        );
    }

    #[test]
    fn the_associated_data_names_purpose_run_and_for_the_wrap_the_key_id() {
        let run_id = RunId::parse("0193c1f2-7d4e-7c3a-9b1a-2f3e4d5c6b7a").expect("v7");
        let key_id = KeyId::parse("k1").expect("valid");
        assert_eq!(
            payload_ad(Purpose::Journal, run_id),
            "countersign:journal:0193c1f2-7d4e-7c3a-9b1a-2f3e4d5c6b7a"
        );
        assert_eq!(
            wrap_ad(Purpose::Journal, run_id, &key_id),
            "countersign:journal:0193c1f2-7d4e-7c3a-9b1a-2f3e4d5c6b7a:k1"
        );
    }

    #[test]
    fn purpose_names_are_the_stored_ones() {
        let names: Vec<_> = Purpose::ALL.iter().map(Purpose::as_str).collect();
        assert_eq!(
            names,
            [
                "state",
                "request",
                "event",
                "journal",
                "comment",
                "webhook_secret"
            ]
        );
    }

    #[test]
    fn every_failure_to_open_is_state_unreadable_and_the_others_are_not() {
        let key_id = KeyId::parse("k").expect("valid");
        let unreadable = [
            CryptoError::Truncated,
            CryptoError::UnknownVersion { version: 2 },
            CryptoError::MalformedKeyId,
            CryptoError::UnknownKey {
                key_id: key_id.clone(),
            },
            CryptoError::Unauthentic { key_id },
        ];
        for err in unreadable {
            assert_eq!(err.code(), "state_unreadable", "{err:?}");
        }
        assert_eq!(CryptoError::TooLarge.code(), "seal_too_large");
        assert_eq!(CryptoError::RandomUnavailable.code(), "random_unavailable");
    }
}
