//! The pseudonym framing: for any identity, the pseudonym is a valid
//! `SubjectDigest`, the same each time; two different identities never share
//! one, not even when one is a prefix of the other, and the kind is framed
//! (the same identity under another kind is another pseudonym).
#![no_main]

use std::sync::{Arc, OnceLock};

use adapter_web::{SubjectKind, VersionedPseudonymizer};
use ca_skeleton_fuzz::pseudonymizer;
use libfuzzer_sys::fuzz_target;
use shared_contract::SubjectDigest;

const KINDS: [SubjectKind; 3] =
    [SubjectKind::Principal, SubjectKind::ApiKey, SubjectKind::ClientIp];

fuzz_target!(|data: &[u8]| {
    static PSEUDONYMIZER: OnceLock<Arc<VersionedPseudonymizer>> = OnceLock::new();
    let pseudonymizer = PSEUDONYMIZER.get_or_init(pseudonymizer);
    let Some((&selector, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let kind = KINDS[usize::from(selector % 3)];
    // Two splits of the same text into (identity, operation).
    let cut = |n: u8| {
        let mut at = usize::from(n).min(text.len());
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.split_at(at)
    };
    // Two prefixes of the same text: distinct identities, one a prefix of
    // the other, as length framing must keep apart.
    let (identity, _) = cut(selector / 3);
    let (other_identity, _) = cut(selector / 3 + 1);
    let one = pseudonymizer.pseudonymize(kind, identity);
    assert_eq!(one, pseudonymizer.pseudonymize(kind, identity), "deterministic");
    assert_eq!(SubjectDigest::parse(one.to_string()), Ok(one), "{one:?}");
    assert!(one.to_string().starts_with("v1:"), "{one:?}");
    if other_identity != identity {
        let two = pseudonymizer.pseudonymize(kind, other_identity);
        assert_ne!(one, two, "{identity:?} vs {other_identity:?}");
    }
    let other_kind = KINDS[usize::from((selector % 3 + 1) % 3)];
    assert_ne!(one, pseudonymizer.pseudonymize(other_kind, identity), "kind is framed");
});
