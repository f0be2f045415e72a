//! Unit tests of the etcd gateway client's encoding helpers and of endpoint parsing.

use serde_json::json;

use super::client::{b64, int, prefix_end, unb64};
use super::discover::split_urls;

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
