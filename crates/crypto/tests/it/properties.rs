use countersign_core::RunId;
use countersign_crypto::{CryptoError, Keyring, Purpose};
use proptest::prelude::*;

use crate::keyring;

fn any_purpose() -> impl Strategy<Value = Purpose> {
    proptest::sample::select(Purpose::ALL.to_vec())
}

/// Arbitrary bytes, and arbitrary bytes behind a valid header naming a key in the ring, so
/// the cases reach the cryptography and not only the version check.
fn envelope_like() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..200),
        proptest::collection::vec(any::<u8>(), 0..200).prop_map(|tail| {
            let mut bytes = vec![1, 2, b'k', b'1'];
            bytes.extend(tail);
            bytes
        }),
    ]
}

proptest! {
    #[test]
    fn opening_arbitrary_bytes_is_always_state_unreadable(
        bytes in envelope_like(),
        purpose in any_purpose(),
    ) {
        let ring = keyring(&["k1"]);
        let err = ring.open(purpose, RunId::new(), &bytes).unwrap_err();
        prop_assert_eq!(err.code(), "state_unreadable");
    }

    #[test]
    fn resealing_arbitrary_bytes_is_always_state_unreadable(bytes in envelope_like()) {
        let ring = keyring(&["k2", "k1"]);
        let err = ring.reseal(Purpose::State, RunId::new(), &bytes).unwrap_err();
        prop_assert_eq!(err.code(), "state_unreadable");
    }

    #[test]
    fn envelope_key_id_of_arbitrary_bytes_is_a_valid_id_or_an_unreadable_error(
        bytes in envelope_like(),
    ) {
        match Keyring::envelope_key_id(&bytes) {
            Ok(key_id) => {
                let n = usize::from(bytes[1]);
                prop_assert_eq!(bytes[0], 1);
                prop_assert_eq!(key_id.as_str().as_bytes(), &bytes[2..2 + n]);
            }
            Err(err) => {
                prop_assert_eq!(err.code(), "state_unreadable");
                let header_only = !matches!(err, CryptoError::UnknownKey { .. });
                prop_assert!(header_only, "{:?}", err);
            }
        }
    }

    #[test]
    fn any_value_round_trips(
        value in proptest::collection::vec(any::<u8>(), 0..2000),
        purpose in any_purpose(),
    ) {
        let ring = keyring(&["k1"]);
        let run_id = RunId::new();
        let envelope = ring.seal(purpose, run_id, &value).unwrap();
        prop_assert_eq!(ring.open(purpose, run_id, &envelope).unwrap(), value);
    }
}
