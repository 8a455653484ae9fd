use countersign_core::RunId;
use countersign_crypto::{CryptoError, Keyring, Purpose};

use crate::keyring;

const VALUE: &[u8] = br#"{"v":1,"transcript":["write the summary"]}"#;

fn assert_unreadable(result: Result<Vec<u8>, CryptoError>, what: &str) -> CryptoError {
    match result {
        Ok(plaintext) => panic!("{what}: opened to {} bytes", plaintext.len()),
        Err(err) => {
            assert_eq!(err.code(), "state_unreadable", "{what}: {err:?}");
            err
        }
    }
}

#[test]
fn a_sealed_value_opens_to_the_same_bytes_for_every_purpose() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    for purpose in Purpose::ALL {
        let envelope = ring.seal(purpose, run_id, VALUE).expect("seals");
        assert_eq!(ring.open(purpose, run_id, &envelope).expect("opens"), VALUE);
    }
}

#[test]
fn an_empty_value_and_a_large_value_round_trip() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let large: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    for value in [&b""[..], &large] {
        let envelope = ring.seal(Purpose::Event, run_id, value).expect("seals");
        assert_eq!(
            ring.open(Purpose::Event, run_id, &envelope).expect("opens"),
            value
        );
    }
}

#[test]
fn two_seals_of_the_same_value_differ_everywhere_but_the_header() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let first = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    let second = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    assert_ne!(first, second);
    // Fresh nonces and a fresh data key: the wrap nonce, the wrapped key, the payload nonce
    // and the payload ciphertext all differ.
    let header = 2 + "k1".len();
    let (wrap_1, wrap_2) = (&first[header..header + 60], &second[header..header + 60]);
    assert_ne!(wrap_1, wrap_2);
    assert_ne!(
        crate::payload_section(&first),
        crate::payload_section(&second)
    );
    assert!(
        !first.windows(VALUE.len()).any(|w| w == VALUE),
        "plaintext visible"
    );
}

#[test]
fn a_flipped_bit_at_every_position_fails_to_open_with_state_unreadable() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let envelope = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    for position in 0..envelope.len() {
        for mask in [0x01u8, 0x80] {
            let mut tampered = envelope.clone();
            tampered[position] ^= mask;
            assert_unreadable(
                ring.open(Purpose::State, run_id, &tampered),
                &format!("byte {position} ^ {mask:#04x}"),
            );
        }
    }
}

#[test]
fn a_keyring_without_the_sealing_key_cannot_open() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let envelope = ring.seal(Purpose::State, run_id, VALUE).expect("seals");

    let other_ids = keyring(&["k2"]);
    let err = assert_unreadable(
        other_ids.open(Purpose::State, run_id, &envelope),
        "other ids",
    );
    assert!(matches!(err, CryptoError::UnknownKey { ref key_id } if key_id.as_str() == "k1"));

    // Same id, different key material.
    let same_id = keyring(&["k1"]);
    let err = assert_unreadable(same_id.open(Purpose::State, run_id, &envelope), "wrong key");
    assert!(matches!(err, CryptoError::Unauthentic { .. }), "{err:?}");
}

#[test]
fn a_value_sealed_for_one_run_does_not_open_for_another() {
    let ring = keyring(&["k1"]);
    let envelope = ring
        .seal(Purpose::State, RunId::new(), VALUE)
        .expect("seals");
    let err = assert_unreadable(ring.open(Purpose::State, RunId::new(), &envelope), "run");
    assert!(matches!(err, CryptoError::Unauthentic { .. }), "{err:?}");
}

#[test]
fn a_value_sealed_for_one_purpose_does_not_open_as_any_other() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    for sealed_as in Purpose::ALL {
        let envelope = ring.seal(sealed_as, run_id, VALUE).expect("seals");
        for opened_as in Purpose::ALL.into_iter().filter(|p| *p != sealed_as) {
            assert_unreadable(
                ring.open(opened_as, run_id, &envelope),
                &format!("{sealed_as} opened as {opened_as}"),
            );
        }
    }
}

#[test]
fn every_truncation_of_an_envelope_fails_to_open_with_state_unreadable() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let envelope = ring.seal(Purpose::Request, run_id, VALUE).expect("seals");
    for length in 0..envelope.len() {
        assert_unreadable(
            ring.open(Purpose::Request, run_id, &envelope[..length]),
            &format!("prefix of {length} bytes"),
        );
    }
}

#[test]
fn an_unknown_version_byte_fails_to_open_with_state_unreadable() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let envelope = ring.seal(Purpose::Journal, run_id, VALUE).expect("seals");
    for version in (0..=u8::MAX).filter(|v| *v != 1) {
        let mut other = envelope.clone();
        other[0] = version;
        let err = assert_unreadable(ring.open(Purpose::Journal, run_id, &other), "version");
        assert_eq!(err, CryptoError::UnknownVersion { version });
        assert_eq!(
            Keyring::envelope_key_id(&other),
            Err(CryptoError::UnknownVersion { version })
        );
    }
}

#[test]
fn bytes_appended_to_an_envelope_make_it_unreadable() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let mut envelope = ring.seal(Purpose::Comment, run_id, VALUE).expect("seals");
    envelope.push(0);
    assert_unreadable(
        ring.open(Purpose::Comment, run_id, &envelope),
        "appended byte",
    );
}

#[test]
fn the_wrapped_key_of_one_envelope_does_not_open_the_payload_of_another() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let first = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    let second = ring
        .seal(Purpose::State, run_id, b"another value")
        .expect("seals");
    let header_and_wrap = first.len() - crate::payload_section(&first).len();
    let mut spliced = first[..header_and_wrap].to_vec();
    spliced.extend_from_slice(crate::payload_section(&second));
    assert_unreadable(ring.open(Purpose::State, run_id, &spliced), "spliced");
}

#[test]
fn envelope_key_id_reads_the_sealing_key_from_the_header() {
    let ring = keyring(&["active-2", "old_1"]);
    let envelope = ring
        .seal(Purpose::State, RunId::new(), VALUE)
        .expect("seals");
    assert_eq!(
        Keyring::envelope_key_id(&envelope).expect("reads").as_str(),
        "active-2"
    );
    assert_eq!(
        Keyring::envelope_key_id(&envelope[..2 + "active-2".len()])
            .expect("the header alone is enough")
            .as_str(),
        "active-2"
    );
    assert_eq!(
        Keyring::envelope_key_id(&envelope[..5]),
        Err(CryptoError::Truncated)
    );
    assert_eq!(Keyring::envelope_key_id(&[]), Err(CryptoError::Truncated));
}

#[test]
fn errors_do_not_contain_the_plaintext() {
    let ring = keyring(&["k1"]);
    let run_id = RunId::new();
    let envelope = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    let err = ring.open(Purpose::Event, run_id, &envelope).unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("transcript"), "{shown}");
    assert!(shown.contains("k1"), "{shown}");
}
