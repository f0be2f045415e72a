//! Tests of kubeconfig reading and writing: kubeadm's documents read and written back, the
//! fast reader agreeing with the YAML parser, and the shape limits.

use super::*;

#[test]
fn base64_round_trips() {
    for data in [&b""[..], b"f", b"fo", b"foo", b"foob", b"fooba", b"foobar"] {
        assert_eq!(base64_decode(&base64_encode(data)).unwrap(), data);
    }
    assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    assert_eq!(base64_encode(b"fo"), "Zm8=");
    assert!(base64_decode("Zm9v!").is_none());
    assert_eq!(base64_decode("Zm9v\n YmFy").unwrap(), b"foobar");
    assert_eq!(base64_decode("Zm8").unwrap(), b"fo");
}

/// The public decoder is only faster: every input gets the constant-time decoder's answer.
#[test]
fn public_base64_decodes_what_the_constant_time_decoder_decodes() {
    let mut inputs: Vec<String> = [
        "",
        "Zg==",
        "Zg",
        "Zg=",
        "Zg===",
        "Zm8=",
        "Zm8",
        "Zm9v",
        "Zm9vYg==",
        "Zm9v\n YmFy",
        "Zm9vYmFy\n",
        " Zm9v",
        "Zh==",
        "Zm9=",
        "Z",
        "Zm9vY",
        "Zm9v!",
        "Zm9v-_",
        "Zm9v+/==",
        "=",
        "====",
        "Zm9v====",
        "Zm=8",
        "Zm9vYmFy=",
        "\tZm9v\r\n",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let lab = base64_encode(&(0..=255u8).cycle().take(1500).collect::<Vec<_>>());
    inputs.push(lab.clone());
    inputs.push(lab.trim_end_matches('=').to_string());
    // Every single-character corruption of a short text.
    for i in 0..8 {
        for c in ["=", "A", "/", "*", " ", "\u{e9}"] {
            let mut t = "Zm9vYmE=".to_string();
            t.replace_range(i..i + 1, c);
            inputs.push(t);
        }
    }
    let mut some = 0;
    for text in &inputs {
        let expect = base64_decode(text);
        some += usize::from(expect.is_some());
        assert_eq!(base64_decode_public(text), expect, "{text:?}");
    }
    assert!(some > 10 && some < inputs.len(), "both outcomes covered");
}

#[test]
fn replaces_only_the_current_user() {
    let yaml = r#"apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: b2xkY2E=
    server: https://10.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: kubernetes-admin
  name: kubernetes-admin@kubernetes
- context:
    cluster: kubernetes
    user: other
  name: other@kubernetes
current-context: kubernetes-admin@kubernetes
kind: Config
preferences: {}
users:
- name: kubernetes-admin
  user:
    client-certificate-data: b2xkY2VydA==
    client-key-data: b2xka2V5
- name: other
  user:
    client-certificate-data: a2VlcA==
    client-key-data: a2VlcA==
"#;
    let mut kc = Kubeconfig::parse(yaml.as_bytes()).unwrap();
    let creds = kc.credentials().unwrap();
    assert_eq!(creds.user, "kubernetes-admin");
    assert_eq!(
        creds.client_certificate,
        Source::Embedded(b"oldcert".to_vec())
    );
    kc.replace_credentials(b"newcert", b"newkey", b"newca")
        .unwrap();
    let out = kc.to_yaml().unwrap();
    let again = Kubeconfig::parse(out.as_bytes())
        .unwrap()
        .credentials()
        .unwrap();
    assert_eq!(
        again.client_certificate,
        Source::Embedded(b"newcert".to_vec())
    );
    assert_eq!(again.client_key, Source::Embedded(b"newkey".to_vec()));
    assert_eq!(
        again.certificate_authority,
        Some(Source::Embedded(b"newca".to_vec()))
    );
    assert!(out.contains("a2VlcA=="), "other user kept");
    assert!(out.contains("server: https://10.0.0.1:6443"));
    assert!(
        out.find("apiVersion").unwrap() < out.find("users").unwrap(),
        "order kept"
    );
}

#[test]
fn every_users_embedded_key_is_scrubbed() {
    let two_users = format!("{SMALL}- name: other\n  user:\n    client-key-data: a2V5\n");
    let mut kc = Kubeconfig::parse(two_users.as_bytes()).unwrap();
    assert!(kc.to_yaml().unwrap().contains("client-key-data: a2V5"));
    kc.scrub_keys();
    let out = kc.to_yaml().unwrap();
    assert!(!out.contains("LS0tS2V5") && !out.contains("a2V5"), "{out}");
    assert!(
        out.contains("client-certificate-data: LS0tQ2VydA=="),
        "the rest is kept"
    );
}

/// The full YAML parser's reading of a text, as the fast path must give it.
fn full(text: &str) -> Option<Value> {
    check_yaml_shape(text).ok()?;
    serde_norway::from_str::<Value>(text).ok()
}

const SMALL: &str = "apiVersion: v1\nclusters:\n- cluster:\n    certificate-authority-data: \
        LS0tQ2E=\n    server: https://10.0.0.1:6443\n  name: kubernetes\ncontexts:\n- context:\n    \
        cluster: kubernetes\n    user: admin\n  name: admin@kubernetes\ncurrent-context: \
        admin@kubernetes\nkind: Config\npreferences: {}\nusers:\n- name: admin\n  user:\n    \
        client-certificate-data: LS0tQ2VydA==\n    client-key-data: LS0tS2V5\n";

#[test]
fn fast_path_reads_what_the_yaml_parser_reads() {
    let lab = Kubeconfig::new_embedded(
        "kubernetes",
        "https://10.0.0.10:6443",
        "kubernetes-admin",
        b"-----BEGIN CERTIFICATE-----\nca\n",
        b"-----BEGIN CERTIFICATE-----\ncert\n",
        b"-----BEGIN RSA PRIVATE KEY-----\nkey\n",
    )
    .to_yaml()
    .unwrap();
    let kubelet = "apiVersion: v1\nclusters:\n- cluster:\n    server: https://x\n  name: c\n\
            contexts:\n- context:\n    cluster: c\n    user: u\n  name: ctx\ncurrent-context: ctx\n\
            kind: Config\nusers:\n- name: u\n  user:\n    client-certificate: /var/lib/kubelet/\
            pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-\
            current.pem\n";
    let indented = "users:\n  - name: u\n    user:\n      a: b\nkind: Config\n";
    for text in [SMALL, &lab, kubelet, indented] {
        let fast = fast::parse(text);
        assert!(fast.is_some(), "fast path refused:\n{text}");
        assert_eq!(fast, full(text), "{text}");
    }
}

#[test]
fn fast_path_leaves_everything_else_to_the_yaml_parser() {
    for text in [
        "a: b",                // no final newline
        "a: b\r\n",            // CRLF
        "a: b # note\n",       // comment
        "a: 'b'\n",            // quotes
        "a:\tb\n",             // tab
        "a: b\n\nc: d\n",      // blank line
        "a: b\na: c\n",        // duplicate key
        "a: yes\n",            // YAML 1.1 boolean
        "a: 12\n",             // number
        "a: ~\n",              // null
        "a:\n",                // null by omission
        "a: [b]\n",            // flow sequence
        "a: &x b\nc: *x\n",    // anchor and alias
        "a:\n  b: c\n d: e\n", // bad indentation
        "- a: b\n",            // top-level sequence
        "a: b:\n",             // mapping value in a scalar
        "true: b\n",           // boolean key
    ] {
        assert_eq!(fast::parse(text), None, "{text:?}");
    }
}

#[test]
fn fast_path_never_differs_from_the_yaml_parser_on_damaged_text() {
    // Every one-byte change of a kubeconfig: the fast path either gives up or reads exactly
    // what the YAML parser reads.
    let bytes = SMALL.as_bytes();
    let mut accepted = 0;
    for i in 0..bytes.len() {
        let mut variants = Vec::new();
        for c in [
            b' ', b'-', b':', b'#', b'"', b'\n', b'x', b'1', b'{', b'/', b'\t',
        ] {
            let mut m = bytes.to_vec();
            m[i] = c;
            variants.push(m);
            let mut m = bytes.to_vec();
            m.insert(i, c);
            variants.push(m);
        }
        let mut m = bytes.to_vec();
        m.remove(i);
        variants.push(m);
        for m in variants {
            let Ok(text) = std::str::from_utf8(&m) else {
                continue;
            };
            if let Some(v) = fast::parse(text) {
                accepted += 1;
                assert_eq!(Some(v), full(text), "{text}");
            }
        }
    }
    assert!(
        accepted > 100,
        "the fast path accepted only {accepted} variants"
    );
}

/// Issue 30.5: a quote inside a plain scalar starts no quoted scalar (YAML's rule), so it
/// hides no bracket after it; real quoted scalars still hide theirs.
#[test]
fn a_quote_inside_a_plain_scalar_hides_no_bracket() {
    let deep = "[".repeat(MAX_YAML_FLOW_DEPTH + 1);
    for text in [
        format!("a: [x 'y, {deep}\n"),
        format!("a: [x \"y, {deep}\n"),
        format!(
            "a: {{k: x 'y, b: {}\n",
            "{a: ".repeat(MAX_YAML_FLOW_DEPTH + 1)
        ),
        format!("a: b'c: {deep}\n"),
        format!("- x 'y {deep}\n"),
        format!("a: [x, y'z, {deep}]\n"),
        format!("a: it's [{deep}\n"),
        // A plain scalar continued on the next line inside a flow collection: the quote
        // at that line's start is part of it.
        format!("a: [x\n 'y, {deep}\n"),
        format!("a: [x,\n y\n 'z, {deep}\n"),
        format!("a: {{k: v\n  'w: {deep}}}\n"),
    ] {
        let e = check_yaml_shape(&text).expect_err(&text);
        assert!(e.contains("nests brackets"), "{text}: {e}");
    }
    // Brackets inside real quoted scalars are text.
    for text in [
        format!("a: '{deep}'\n"),
        format!("a: \"{deep}\"\n"),
        format!("a: [x, '{deep}', \"{deep}\"]\n"),
        format!("a: {{k: '{deep}'}}\n"),
        format!("- '{deep}'\n"),
        format!("'{deep}': v\n"),
        format!("a: &x '{deep}'\n"),
        format!("a: !!str '{deep}'\n"),
    ] {
        assert_eq!(check_yaml_shape(&text), Ok(()), "{text}");
        assert!(serde_norway::from_str::<Value>(&text).is_ok(), "{text}");
    }
}

/// Issue 30.5, the growth measured as work: the shape check examines each byte at most
/// once (so it is linear), refuses every hostile family before the parser sees it, and
/// reads a large legitimate kubeconfig to its end. `agent/parser-growth.sh` counts `check`'s instructions on
/// the same families, growing, with the real parser behind.
#[test]
fn the_shape_check_examines_each_byte_at_most_once() {
    let user = "- name: u\n  user:\n    client-certificate-data: LS0tQ2VydA==\n    \
                    client-key-data: LS0tS2V5\n";
    for size in [1usize << 10, 1 << 14, 1 << 17, 1 << 20] {
        let hostile = [
            ("apostrophe", format!("a: [x 'y, {}\n", "[".repeat(size))),
            ("quote", format!("a: [x \"y, {}\n", "[".repeat(size))),
            ("continued", format!("a: [x\n 'y, {}\n", "[".repeat(size))),
            (
                "flow map",
                format!("a: {}\n", "{k: x 'y, b: ".repeat(size / 12)),
            ),
            ("aliases", "a: [*x, ".repeat(size / 8)),
            ("indicators", format!("{}x\n", "- ".repeat(size / 2))),
            ("indent", format!("{}k: v\n", " ".repeat(size))),
        ];
        for (what, doc) in &hostile {
            let (result, scanned) = shape_scan(doc);
            assert!(result.is_err(), "{what} {size}: accepted");
            assert!(
                scanned <= doc.len(),
                "{what} {size}: {scanned} > {}",
                doc.len()
            );
        }
        let legit = format!("{SMALL}{}", user.repeat(size / user.len()));
        let (result, scanned) = shape_scan(&legit);
        assert_eq!(result, Ok(()));
        assert_eq!(
            scanned,
            legit.len(),
            "{size}: every byte of a sound file, once"
        );
    }
}

/// Issue 30.3: names YAML 1.1 (client-go) reads as booleans, nulls, numbers or dates are
/// written quoted, and the written text reads back as the same document; a kubeadm-shaped
/// kubeconfig is written exactly as client-go writes it.
#[test]
fn names_yaml_1_1_reads_otherwise_are_written_quoted() {
    for name in [
        "on",
        "OFF",
        "no",
        "Y",
        "n",
        "true",
        "null",
        "~",
        "1_000",
        "0x1F",
        "1e3",
        ".inf",
        "12:30",
        "1:20:30",
        "2001-12-14",
        "=",
        "<<",
        "- x",
        "a: b",
        "c #d",
        "'q'",
        "",
        " lead",
        "caf\u{e9}",
        "x\ny",
    ] {
        let text = SMALL
            .replace(
                "name: admin\n",
                &format!("name: {}\n", serde_json::to_string(name).unwrap()),
            )
            .replace(
                "user: admin\n",
                &format!("user: {}\n", serde_json::to_string(name).unwrap()),
            );
        let kc = Kubeconfig::parse(text.as_bytes()).unwrap();
        let out = kc.to_yaml().unwrap();
        assert!(
            out.contains(&format!(
                "- name: {}\n",
                serde_json::to_string(name).unwrap()
            )),
            "{name:?} not quoted:\n{out}"
        );
        let again = Kubeconfig::parse(out.as_bytes()).unwrap();
        assert_eq!(again.doc, kc.doc, "{name:?}");
        assert_eq!(again.credentials().unwrap().user, name);
    }
    let kc = Kubeconfig::parse(SMALL.as_bytes()).unwrap();
    assert_eq!(kc.to_yaml().unwrap(), SMALL);
}

/// Issue 30.11: read as client-go reads, or refused with the reason.
#[test]
fn kubeconfigs_are_read_as_client_go_reads_them_or_refused() {
    let bom = format!("\u{feff}{SMALL}");
    assert_eq!(
        Kubeconfig::parse(bom.as_bytes()).unwrap().doc,
        Kubeconfig::parse(SMALL.as_bytes()).unwrap().doc
    );
    let two_users = format!("{SMALL}- name: admin\n  user:\n    token: x\n");
    let e = Kubeconfig::parse(two_users.as_bytes()).unwrap_err().0;
    assert!(
        e.contains("user 'admin' twice") && e.contains("client-go"),
        "{e}"
    );
    let two_docs = format!("{SMALL}---\n{SMALL}");
    let e = Kubeconfig::parse(two_docs.as_bytes()).unwrap_err().0;
    assert!(e.contains("several YAML documents"), "{e}");
    let two_keys = SMALL.replace("kind: Config\n", "kind: Config\nkind: Config\n");
    let e = Kubeconfig::parse(two_keys.as_bytes()).unwrap_err().0;
    assert!(e.contains("duplicate"), "{e}");
    assert_eq!(
        file_under_root("etc/kubernetes/admin.conf", "pki/a.crt"),
        "etc/kubernetes/pki/a.crt"
    );
    assert_eq!(
        file_under_root("etc/kubernetes/kubelet.conf", "/var/lib/kubelet/pki/x.pem"),
        "var/lib/kubelet/pki/x.pem"
    );
    assert_eq!(file_under_root("admin.conf", "a.crt"), "a.crt");
}

#[test]
fn file_credentials_are_reported_not_replaced() {
    let yaml = "apiVersion: v1\nclusters:\n- cluster:\n    server: https://x\n  name: default-cluster\ncontexts:\n- context:\n    cluster: default-cluster\n    user: default-auth\n  name: default-context\ncurrent-context: default-context\nkind: Config\nusers:\n- name: default-auth\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n    client-key: /var/lib/kubelet/pki/kubelet-client-current.pem\n";
    let mut kc = Kubeconfig::parse(yaml.as_bytes()).unwrap();
    let c = kc.credentials().unwrap();
    assert_eq!(
        c.client_certificate,
        Source::File("/var/lib/kubelet/pki/kubelet-client-current.pem".into())
    );
    assert!(kc.replace_credentials(b"a", b"b", b"c").is_err());
    assert!(Kubeconfig::parse(b"[1,2]").is_err());
    assert!(
        Kubeconfig::parse(b"current-context: x\n")
            .unwrap()
            .credentials()
            .is_err()
    );
}
