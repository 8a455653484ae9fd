use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use countersign_core::RunId;
use countersign_crypto::{Keyring, KeyringError, Purpose};

use crate::{entries, key_id};

#[test]
fn the_first_of_several_ids_seals_and_every_id_opens() {
    let first = entries(&["one"]);
    let second = entries(&["two"]);
    let third = entries(&["three"]);
    let ring = Keyring::parse(&format!("{first},{second}\n{third}")).expect("parses");
    assert_eq!(ring.active_key_id().as_str(), "one");
    let ids: Vec<_> = ring.key_ids().map(|id| id.as_str()).collect();
    assert_eq!(ids, ["one", "two", "three"]);

    let run_id = RunId::new();
    let sealed = ring.seal(Purpose::State, run_id, b"v").expect("seals");
    assert_eq!(
        Keyring::envelope_key_id(&sealed).expect("header").as_str(),
        "one"
    );

    for entry in [&second, &third] {
        let older = Keyring::parse(entry).expect("parses");
        let sealed = older.seal(Purpose::State, run_id, b"v").expect("seals");
        assert_eq!(
            ring.open(Purpose::State, run_id, &sealed).expect("opens"),
            b"v"
        );
    }
}

#[test]
fn a_key_file_has_the_same_format_as_the_variable() {
    let active = entries(&["file-active"]);
    let older = entries(&["file-older"]);
    let path = std::env::temp_dir().join(format!("countersign-it-keys-{}", std::process::id()));
    std::fs::write(
        &path,
        format!("# countersign keys\n{active}\n\n# older\n{older}\n"),
    )
    .expect("writes");
    let loaded = Keyring::from_file(&path);
    std::fs::remove_file(&path).expect("removes");
    let ring = loaded.expect("loads");
    let ids: Vec<_> = ring.key_ids().map(|id| id.as_str()).collect();
    assert_eq!(ids, ["file-active", "file-older"]);
}

#[test]
fn a_missing_key_file_is_reported_with_its_path() {
    let path = std::path::Path::new("/nonexistent/countersign/keys");
    let err = Keyring::from_file(path).unwrap_err();
    assert_eq!(err.code(), "keyring_file_unreadable");
    assert!(
        err.to_string().contains("/nonexistent/countersign/keys"),
        "{err}"
    );
}

#[test]
fn debug_of_a_keyring_shows_ids_and_no_key_material() {
    let entry = Keyring::generate_entry(&key_id("visible-id"));
    let encoded = entry.split_once(':').expect("id:key").1.to_owned();
    let ring = Keyring::parse(&entry).expect("parses");
    let shown = format!("{ring:?} {ring:#?}");
    assert!(shown.contains("visible-id"), "{shown}");
    assert!(!shown.contains(&encoded), "{shown}");
    // Not even a fragment of the key, in base64 or as a list of bytes.
    assert!(!shown.contains(&encoded[..8]), "{shown}");
    let bytes = STANDARD.decode(&encoded).expect("base64");
    let as_list = format!("{}, {}, {}", bytes[0], bytes[1], bytes[2]);
    assert!(!shown.contains(&as_list), "{shown}");
}

#[test]
fn a_keyring_error_never_contains_the_key_it_rejected() {
    let entry = Keyring::generate_entry(&key_id("k"));
    let encoded = entry.split_once(':').expect("id:key").1;
    let short = &encoded[..40];
    let specs = [
        format!("k:{short}"),               // 30 bytes
        format!("k:{encoded},k:{encoded}"), // duplicate id
        encoded.to_owned(),                 // no id
        format!("{encoded}:k"),             // id and key swapped
        format!("k:{encoded}AAAA"),         // padding in the middle
    ];
    for spec in specs {
        let err = Keyring::parse(&spec).unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains(short), "{spec}: {shown}");
    }
}

#[test]
fn a_keyring_error_has_a_stable_code() {
    assert_eq!(Keyring::parse("").unwrap_err().code(), "keyring_empty");
    assert!(matches!(
        Keyring::parse("id-only").unwrap_err(),
        KeyringError::MalformedEntry { entry: 1 }
    ));
}
