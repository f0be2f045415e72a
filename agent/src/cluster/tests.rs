//! Unit tests of the etcd gateway client's encoding helpers, of endpoint parsing, and of the
//! apiserver gate's choice of registrations at a chosen instant.

use serde_json::json;

use super::APISERVERS_PREFIX;
use super::client::{Access, b64, int, prefix_end, unb64};
use super::discover::{NodeInfo, split_urls};
use super::gates::candidates;
use crate::sys::clock::DAY;

#[test]
fn prefix_end_increments_the_last_byte() {
    assert_eq!(prefix_end("a/"), b"a0".to_vec());
    assert_eq!(int(Some(&json!("42"))), Some(42));
    assert_eq!(int(Some(&json!(7))), Some(7));
    assert_eq!(unb64(Some(&json!(b64(b"x")))).unwrap(), b"x".to_vec());
    assert_eq!(
        split_urls("https://a:1, https://b:2/"),
        vec!["https://a:1", "https://b:2"]
    );
}

/// Another control plane's registration is probed while it is at most a week old at the instant
/// the gate looks (the caller's clock), and not a second later.
#[test]
fn a_registration_older_than_a_week_is_not_probed() {
    let node = NodeInfo {
        name: "cp-0".into(),
        apiserver: None,
        etcd_member: true,
        access: Access::new(vec![], String::new(), vec![], vec![], vec![]),
    };
    let now = 1_795_356_814;
    let registration = vec![(
        format!("{APISERVERS_PREFIX}cp-1"),
        json!({ "endpoint": "127.0.0.2:6443", "updated_unix": now - 7 * DAY })
            .to_string()
            .into_bytes(),
    )];
    let addr: std::net::SocketAddr = "127.0.0.2:6443".parse().unwrap();
    assert_eq!(candidates(registration.clone(), &node, now), [addr]);
    assert!(candidates(registration, &node, now + 1).is_empty());
}
