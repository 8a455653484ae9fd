use countersign_core::RunId;
use countersign_crypto::{CryptoError, Keyring, Purpose};

use crate::{key_id, payload_section};

const VALUE: &[u8] = b"suspended state of a run";

/// A keyring with the old key only, and the same old key behind a new active one, as an
/// operator writes them during a rotation.
fn before_and_during_rotation() -> (Keyring, Keyring, String) {
    let old = Keyring::generate_entry(&key_id("old"));
    let new = Keyring::generate_entry(&key_id("new-2"));
    let before = Keyring::parse(&old).expect("parses");
    let during = Keyring::parse(&format!("{new}\n{old}")).expect("parses");
    (before, during, new)
}

#[test]
fn reseal_moves_an_envelope_to_the_active_key_and_keeps_the_payload_bytes() {
    let (before, during, new) = before_and_during_rotation();
    let run_id = RunId::new();
    let sealed = before.seal(Purpose::State, run_id, VALUE).expect("seals");
    assert_eq!(
        Keyring::envelope_key_id(&sealed).expect("header").as_str(),
        "old"
    );

    let resealed = during
        .reseal(Purpose::State, run_id, &sealed)
        .expect("reseals")
        .expect("the envelope was under an old key");

    assert_eq!(
        Keyring::envelope_key_id(&resealed)
            .expect("header")
            .as_str(),
        "new-2"
    );
    assert_eq!(payload_section(&resealed), payload_section(&sealed));
    assert_eq!(
        during
            .open(Purpose::State, run_id, &resealed)
            .expect("opens"),
        VALUE
    );

    // The old key is retired: a keyring with only the new key still opens the value, and
    // no longer opens what was not resealed.
    let after = Keyring::parse(&new).expect("parses");
    assert_eq!(
        after
            .open(Purpose::State, run_id, &resealed)
            .expect("opens"),
        VALUE
    );
    let err = after.open(Purpose::State, run_id, &sealed).unwrap_err();
    assert!(matches!(err, CryptoError::UnknownKey { .. }), "{err:?}");
}

#[test]
fn reseal_of_an_envelope_already_under_the_active_key_returns_none() {
    let (_, during, _) = before_and_during_rotation();
    let run_id = RunId::new();
    let sealed = during.seal(Purpose::Request, run_id, VALUE).expect("seals");
    assert_eq!(during.reseal(Purpose::Request, run_id, &sealed), Ok(None));
}

#[test]
fn reseal_is_bound_to_the_same_purpose_and_run_as_open() {
    let (before, during, _) = before_and_during_rotation();
    let run_id = RunId::new();
    let sealed = before.seal(Purpose::State, run_id, VALUE).expect("seals");
    for (purpose, run) in [(Purpose::Event, run_id), (Purpose::State, RunId::new())] {
        let err = during.reseal(purpose, run, &sealed).unwrap_err();
        assert_eq!(err.code(), "state_unreadable", "{err:?}");
    }
}

#[test]
fn reseal_refuses_an_envelope_whose_payload_was_tampered_with() {
    let (before, during, _) = before_and_during_rotation();
    let run_id = RunId::new();
    let mut sealed = before.seal(Purpose::State, run_id, VALUE).expect("seals");
    let last = sealed.len() - 1;
    sealed[last] ^= 1;
    let err = during.reseal(Purpose::State, run_id, &sealed).unwrap_err();
    assert!(matches!(err, CryptoError::Unauthentic { .. }), "{err:?}");
    assert_eq!(err.code(), "state_unreadable");
}

#[test]
fn reseal_of_an_envelope_under_a_key_not_in_the_ring_is_unreadable() {
    let (before, _, new) = before_and_during_rotation();
    let run_id = RunId::new();
    let sealed = before.seal(Purpose::State, run_id, VALUE).expect("seals");
    let after = Keyring::parse(&new).expect("parses");
    let err = after.reseal(Purpose::State, run_id, &sealed).unwrap_err();
    assert!(matches!(err, CryptoError::UnknownKey { ref key_id } if key_id.as_str() == "old"));
}

#[test]
fn a_wrapped_key_relabelled_with_another_key_id_does_not_open() {
    // Two ids holding the same key material: the key id in the wrap's associated data is
    // what stops an envelope from being relabelled between them.
    let entry = Keyring::generate_entry(&key_id("aa"));
    let material = entry.split_once(':').expect("id:key").1;
    let ring = Keyring::parse(&format!("aa:{material},bb:{material}")).expect("parses");
    let run_id = RunId::new();
    let mut envelope = ring.seal(Purpose::State, run_id, VALUE).expect("seals");
    envelope[2..4].copy_from_slice(b"bb");
    let err = ring.open(Purpose::State, run_id, &envelope).unwrap_err();
    assert!(matches!(err, CryptoError::Unauthentic { ref key_id } if key_id.as_str() == "bb"));
}
